/*
 * instrument.c: the instrument hook of models built with --instrument (TVM's VM set_instrument,
 * in bytecode and compiled code alike): every Call instruction reports to the VM's hook before
 * and after it runs, and the hook may skip it. Models built without --instrument never come
 * here: their compiled code calls its targets directly and the interpreter takes its plain path.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { HOOK_INLINE_ARGS = 20, DTYPE_NAME = 32 };

static int call_target(rvm_vm *vm, int64_t callee, const TVMFFIAny *args, int32_t n, TVMFFIAny *ret) {
  const rvm_func_info *target = &vm->program->funcs[callee];
  return target->kind == RVM_FUNC_PACKED ? target->packed(NULL, args, n, ret) : rvm_invoke(vm, callee, args, n, ret);
}

int rvm_instrumented_call(rvm_vm *vm, int64_t callee, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  if (!vm->instrument) return call_target(vm, callee, args, num_args, result);
  int32_t n = 4 + num_args;
  TVMFFIAny inline_hook[HOOK_INLINE_ARGS];
  char inline_names[HOOK_INLINE_ARGS][DTYPE_NAME];
  TVMFFIAny *hook = n <= HOOK_INLINE_ARGS ? inline_hook : rvm_mem_alloc(sizeof(TVMFFIAny) * (size_t)n, "instrument hook arguments");
  char (*names)[DTYPE_NAME] = num_args <= HOOK_INLINE_ARGS ? inline_names : rvm_mem_alloc(DTYPE_NAME * (size_t)num_args, "instrument hook arguments");
  if (!hook || !names) {
    if (hook != inline_hook) rvm_mem_free(hook);
    if (names != inline_names) rvm_mem_free(names);
    return rvm_raise("MemoryError", "out of memory for the instrument hook's arguments");
  }
  hook[0] = vm->func_pool[callee];
  hook[1] = rvm_none();
  hook[1].type_index = kTVMFFIRawStr;
  hook[1].v_c_str = vm->program->funcs[callee].name;
  hook[2] = rvm_none();
  hook[2].type_index = kTVMFFIBool;
  hook[2].v_int64 = 1;
  hook[3] = rvm_none();
  for (int32_t i = 0; i < num_args; i++) {
    hook[4 + i] = args[i];
    if (args[i].type_index == kTVMFFIDataType) { /* TVM hands dtypes to the hook as strings */
      rvm_format_dtype(args[i].v_dtype, names[i], DTYPE_NAME);
      hook[4 + i] = rvm_none();
      hook[4 + i].type_index = kTVMFFIRawStr;
      hook[4 + i].v_c_str = names[i];
    }
  }
  TVMFFIAny verdict = {0};
  int rc = vm->instrument(vm->instrument_self, hook, n, &verdict);
  bool skip = rc == 0 && verdict.type_index == kTVMFFIInt && verdict.v_int64 == 1;
  rvm_any_release(&verdict);
  if (rc == 0 && skip) {
    *result = rvm_none();
  } else if (rc == 0) {
    rc = call_target(vm, callee, args, num_args, result);
    if (rc == 0) {
      hook[2].v_int64 = 0;
      hook[3] = *result;
      rc = vm->instrument(vm->instrument_self, hook, n, &verdict);
      rvm_any_release(&verdict);
      if (rc) rvm_any_release(result);
    }
  }
  if (hook != inline_hook) rvm_mem_free(hook);
  if (names != inline_names) rvm_mem_free(names);
  return rc;
}
