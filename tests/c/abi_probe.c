/* abi_probe.c: prints the layouts Rust mirrors (program tables, API table, values), one
 * "name value" per line; tests/artifact.rs compares them with the Rust side's numbers. */
#include <stddef.h>
#include <stdio.h>

#include "internal.h"

#define P(name, value) printf("%s %zu\n", name, (size_t)(value))

int main(void) {
  P("func_info.size", sizeof(rvm_func_info));
  P("func_info.packed", offsetof(rvm_func_info, packed));
  P("func_info.param_names", offsetof(rvm_func_info, param_names));
  P("func_info.start_instr", offsetof(rvm_func_info, start_instr));
  P("func_info.end_instr", offsetof(rvm_func_info, end_instr));
  P("func_info.register_file_size", offsetof(rvm_func_info, register_file_size));
  P("func_info.kind", offsetof(rvm_func_info, kind));
  P("func_info.num_args", offsetof(rvm_func_info, num_args));
  P("func_info.compiled", offsetof(rvm_func_info, compiled));
  P("const_info.size", sizeof(rvm_const_info));
  P("const_info.shape", offsetof(rvm_const_info, shape));
  P("const_info.size_field", offsetof(rvm_const_info, size));
  P("const_info.kind", offsetof(rvm_const_info, kind));
  P("const_info.ndim", offsetof(rvm_const_info, ndim));
  P("const_info.dtype", offsetof(rvm_const_info, dtype));
  P("program.size", sizeof(rvm_program));
  P("program.funcs", offsetof(rvm_program, funcs));
  P("program.consts", offsetof(rvm_program, consts));
  P("program.instr_offset", offsetof(rvm_program, instr_offset));
  P("program.instr_data", offsetof(rvm_program, instr_data));
  P("api.abi_version", RVM_ABI_VERSION);
  P("program.magic_value_low32", RVM_PROGRAM_MAGIC & 0xffffffffu);
  P("storage.data", offsetof(rvm_storage, data));
  P("storage.nbytes", offsetof(rvm_storage, nbytes));
  P("storage.device", offsetof(rvm_storage, device));
  P("storage.type_index", RVM_TYPE_STORAGE);
  P("shape.data", sizeof(TVMFFIObject) + offsetof(TVMFFIShapeCell, data));
  P("api.size", sizeof(rvm_api));
  P("api.vm_call", offsetof(rvm_api, vm_call));
  P("api.tensor_export", offsetof(rvm_api, tensor_export));
  P("api.value_release", offsetof(rvm_api, value_release));
  P("api.function_call", offsetof(rvm_api, function_call));
  P("any.size", sizeof(TVMFFIAny));
  P("dltensor.size", sizeof(DLTensor));
  P("dltensor.byte_offset", offsetof(DLTensor, byte_offset));
  P("module_info.size", sizeof(rvm_module_info));
  P("vm_stats.size", sizeof(rvm_vm_stats));
  return 0;
}
