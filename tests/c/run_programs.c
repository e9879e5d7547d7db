/*
 * run_programs.c: calls every `*_main(x: float32[4], k: int)` function of a model twice and
 * releases the results; tests/c_api.rs runs it under valgrind over a batch of random programs.
 * Errors are expected for some programs and only counted.
 * usage: run_programs MODEL.so
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rvm.h"

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 3;
  const rvm_api *api = ((rvm_get_api_fn)dlsym(lib, "rvm_get_api"))(RVM_ABI_VERSION);
  rvm_module *module;
  rvm_vm *vm;
  if (!api || api->module_open(&module) || api->vm_create(module, &vm)) return 4;
  float *x = aligned_alloc(64, 64);
  x[0] = 0.5f, x[1] = -1.25f, x[2] = 2.0f, x[3] = 3.0f;
  int64_t shape[1] = {4};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  rvm_value args[2] = {{.type_index = kTVMFFIDLTensorPtr, .v_ptr = &t}, {.type_index = kTVMFFIInt, .v_int64 = 2}};
  int calls = 0, errors = 0;
  for (int32_t f = 0; api->function_name(module, f); f++) {
    const char *name = api->function_name(module, f);
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 5, "_main") != 0) continue;
    for (int round = 0; round < 2; round++) {
      rvm_value out = {0};
      calls++;
      if (api->vm_call(vm, f, args, 2, &out) != 0) errors++;
      api->value_release(&out);
    }
  }
  rvm_vm_stats stats;
  api->vm_stats(vm, &stats);
  printf("run_programs: %d calls, %d errors, %llu bytes of storage still held\n", calls, errors,
         (unsigned long long)stats.live_storage_bytes);
  api->vm_destroy(vm);
  api->module_close(module);
  dlclose(lib);
  free(x);
  return stats.live_storage_bytes == 0 && calls > 0 ? 0 : 1;
}
