# A model whose kernels call functions the host registers by name (tests/c/registry_test.c).
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class HostCall:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            y = R.call_dps_packed("call_host", (x,), out_ty=R.Tensor((4,), "float32"))
            R.output(y)
        return y

    @R.function
    def missing(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            y = R.call_dps_packed("call_missing", (x,), out_ty=R.Tensor((4,), "float32"))
            R.output(y)
        return y
