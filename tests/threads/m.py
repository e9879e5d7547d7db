# A model whose one kernel launches parallel work from inside parallel work (tests/c/threads_test.c).
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Nested:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            y = R.call_dps_packed("nested_scale", (x,), out_ty=R.Tensor((64, 64), "float32"))
            R.output(y)
        return y
