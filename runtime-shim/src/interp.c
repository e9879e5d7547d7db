/*
 * interp.c: the bytecode interpreter, and calls into Relax functions of either kind.
 *
 * It runs TVM's instruction encoding in place from .rodata. relaxc verified every executable
 * ahead of time (register, constant and function indices, jump targets, argument kinds), so the
 * loop does no bounds checks of its own. Register files live on a per-VM stack of chunks that
 * never move; a frame's registers are zero on entry and are released and zeroed on exit, so
 * entering a frame costs nothing beyond storing the arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { RVM_INLINE_ARGS = 16, RVM_MAX_DEPTH = 4096, RVM_CHUNK_REGS = 4096 };

struct rvm_frame_chunk {
  rvm_frame_chunk *prev, *next;
  int64_t used, capacity;
  TVMFFIAny regs[];
};

/* Takes n zeroed registers from the VM's stack. */
static TVMFFIAny *frame_push(rvm_vm *vm, int64_t n) {
  rvm_frame_chunk *c = vm->frames;
  if (c && c->used + n <= c->capacity) {
    TVMFFIAny *regs = c->regs + c->used;
    c->used += n;
    return regs;
  }
  /* Move on to the next chunk. Chunks above the top are empty, so a too-small one (and any
   * above it) is simply replaced. */
  rvm_frame_chunk *next = c ? c->next : NULL;
  if (next && next->capacity < n) {
    for (rvm_frame_chunk *x = next; x;) {
      rvm_frame_chunk *after = x->next;
      rvm_mem_free(x);
      x = after;
    }
    if (c) c->next = NULL;
    next = NULL;
  }
  if (!next) {
    int64_t cap = n > RVM_CHUNK_REGS ? n : RVM_CHUNK_REGS;
    size_t bytes = sizeof(rvm_frame_chunk) + sizeof(TVMFFIAny) * (size_t)cap;
    next = rvm_mem_alloc_in(vm->heap, bytes, 16, "a register frame");
    if (next) memset(next, 0, bytes);
    if (!next) {
      rvm_raise("MemoryError", "out of memory for a %lld-register frame", (long long)n);
      return NULL;
    }
    next->capacity = cap;
    next->prev = c;
    if (c) c->next = next;
  }
  vm->frames = next;
  next->used = n;
  return next->regs;
}

/* Releases a frame's registers (leaving them zero) and gives them back to the stack. */
static void frame_pop(rvm_vm *vm, TVMFFIAny *regs, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (regs[i].type_index >= kTVMFFIStaticObjectBegin) rvm_object_decref(regs[i].v_obj);
    memset(&regs[i], 0, sizeof(TVMFFIAny));
  }
  rvm_frame_chunk *c = vm->frames;
  c->used -= n;
  if (c->used == 0 && c->prev) vm->frames = c->prev;
}

void rvm_frames_free(rvm_vm *vm) {
  rvm_frame_chunk *c = vm->frames;
  while (c && c->prev) c = c->prev;
  while (c) {
    rvm_frame_chunk *next = c->next;
    rvm_mem_free(c);
    c = next;
  }
  vm->frames = NULL;
}

static int arity_error(const rvm_func_info *fi, int32_t got) {
  char names[512];
  size_t at = 0;
  names[0] = 0;
  for (int32_t i = 0; i < fi->num_args && at < sizeof names; i++)
    at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", fi->param_names[i]);
  return rvm_raise("TypeError", "Invoking function %s expects %d arguments (%s), but %d arguments were provided.", fi->name,
                   fi->num_args, names, got);
}

/* The interpreter loop, made twice: plain, and for instrumented models, where every Call reports
 * to the VM's hook (instrument.c). The flag is a constant in each copy, so the plain loop pays
 * nothing for instrumentation. */
static inline __attribute__((always_inline)) int interpret(rvm_vm *vm, const rvm_func_info *fi, TVMFFIAny *regs,
                                                            TVMFFIAny *result, const bool instrumented) {
  const rvm_program *prog = vm->program;
  const int64_t *offsets = prog->instr_offset, *data = prog->instr_data;
  const rvm_func_info *funcs = prog->funcs;
  const TVMFFIAny *consts = vm->consts, *pool = vm->func_pool;
  TVMFFIAny inline_args[RVM_INLINE_ARGS];
  int64_t pc = fi->start_instr;
  for (;;) {
    const int64_t *ins = data + offsets[pc];
    switch (ins[0]) {
      case RVM_OP_CALL: {
        int64_t dst = ins[1], callee = ins[2];
        int32_t n = (int32_t)ins[3];
        TVMFFIAny *argv = inline_args;
        if (n > RVM_INLINE_ARGS) {
          argv = rvm_mem_alloc(sizeof(TVMFFIAny) * (size_t)n, "call arguments");
          if (!argv) {
            rvm_raise("MemoryError", "out of memory for %d call arguments", n);
            rvm_error_locate(fi->name, pc - fi->start_instr, funcs[callee].name);
            return -1;
          }
        }
        for (int32_t i = 0; i < n; i++) {
          int64_t word = ins[4 + i];
          int64_t value = (int64_t)((uint64_t)word << 8) >> 8;
          switch ((uint64_t)word >> 56) {
            case RVM_ARG_REG:
              if (value < RVM_REG_VOID) {
                argv[i] = regs[value];
              } else if (value == RVM_REG_VOID) {
                argv[i] = rvm_none();
              } else {
                argv[i] = rvm_none();
                argv[i].type_index = kTVMFFIOpaquePtr;
                argv[i].v_ptr = vm;
              }
              break;
            case RVM_ARG_IMM:
              argv[i] = rvm_int(value);
              break;
            case RVM_ARG_CONST:
              argv[i] = consts[value];
              break;
            default:
              argv[i] = pool[value];
              break;
          }
        }
        TVMFFIAny ret = {0};
        const rvm_func_info *target = &funcs[callee];
        int rc = instrumented                        ? rvm_instrumented_call(vm, callee, argv, n, &ret)
                 : target->kind == RVM_FUNC_PACKED ? target->packed(NULL, argv, n, &ret)
                                                   : rvm_invoke(vm, callee, argv, n, &ret);
        if (argv != inline_args) rvm_mem_free(argv);
        if (rc != 0) {
          rvm_error_locate(fi->name, pc - fi->start_instr, target->name);
          return rc;
        }
        if (dst < RVM_REG_VOID) {
          if (regs[dst].type_index >= kTVMFFIStaticObjectBegin) rvm_object_decref(regs[dst].v_obj);
          regs[dst] = ret;
        } else if (ret.type_index >= kTVMFFIStaticObjectBegin) {
          rvm_object_decref(ret.v_obj);
        }
        pc++;
        break;
      }
      case RVM_OP_RET: {
        int64_t r = ins[1];
        if (r < RVM_REG_VOID) {
          *result = regs[r];
          memset(&regs[r], 0, sizeof(TVMFFIAny));
        } else {
          *result = rvm_none();
        }
        return 0;
      }
      case RVM_OP_GOTO:
        pc += ins[1];
        break;
      case RVM_OP_IF: {
        const TVMFFIAny *c = &regs[ins[1]];
        if (c->type_index != kTVMFFIInt && c->type_index != kTVMFFIBool) return rvm_if_cond_error(fi->name, pc - fi->start_instr, c);
        pc += c->v_int64 != 0 ? 1 : ins[2];
        break;
      }
      default:
        rvm_raise("InternalError", "unknown opcode %lld", (long long)ins[0]);
        rvm_error_locate(fi->name, pc - fi->start_instr, "?");
        return -1;
    }
  }
}

static int run_bytecode(rvm_vm *vm, const rvm_func_info *fi, TVMFFIAny *regs, TVMFFIAny *result) {
  if (__builtin_expect(vm->program->exec_mode & RVM_PROGRAM_INSTRUMENTED, 0)) return interpret(vm, fi, regs, result, true);
  return interpret(vm, fi, regs, result, false);
}

int rvm_invoke(rvm_vm *vm, int64_t func, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  const rvm_func_info *fi = &vm->program->funcs[func];
  if (fi->kind == RVM_FUNC_PACKED) return fi->packed(NULL, args, num_args, result);
  if (num_args != fi->num_args) return arity_error(fi, num_args);
  if (vm->depth >= RVM_MAX_DEPTH)
    return rvm_raise("RecursionError", "calling %s: more than %d nested Relax calls", fi->name, RVM_MAX_DEPTH);
  int64_t nregs = fi->register_file_size;
  TVMFFIAny *regs = frame_push(vm, nregs);
  if (!regs) return -1;
  for (int32_t i = 0; i < num_args; i++) {
    if (rvm_any_copy(&args[i], &regs[i])) {
      frame_pop(vm, regs, nregs);
      return -1;
    }
  }
  vm->depth++;
  int rc;
  if (fi->kind == RVM_FUNC_COMPILED) {
    rc = fi->compiled(vm, regs, result, vm->consts, vm->func_pool);
  } else {
    rc = run_bytecode(vm, fi, regs, result);
  }
  vm->depth--;
  frame_pop(vm, regs, nregs);
  return rc;
}

int rvm_if_cond_error(const char *function, int64_t pc, const TVMFFIAny *cond) {
  rvm_raise("TypeError", "Cannot convert from type `%s` to `int`", rvm_type_name(cond));
  rvm_error_locate(function, pc, "If");
  return -1;
}

int rvm_compiled_fail(rvm_vm *vm, int64_t func, int64_t pc) {
  const rvm_program *prog = vm->program;
  const int64_t *ins = prog->instr_data + prog->instr_offset[prog->funcs[func].start_instr + pc];
  /* Compiled code fails only at Calls (If's own error has its own path). */
  const char *callee = ins[0] == RVM_OP_CALL ? prog->funcs[ins[2]].name : "?";
  rvm_error_locate(prog->funcs[func].name, pc, callee);
  return -1;
}

int rvm_compiled_bad_cond(rvm_vm *vm, int64_t func, int64_t pc, const TVMFFIAny *cond) {
  return rvm_if_cond_error(vm->program->funcs[func].name, pc, cond);
}

int rvm_invoke_value(rvm_vm *vm, const TVMFFIAny *callee, const TVMFFIAny *args, int32_t num_args, TVMFFIAny *result) {
  if (callee->type_index == kTVMFFIFunction) {
    const rvm_function *f = (const rvm_function *)callee->v_obj;
    return f->cell.safe_call((void *)f, args, num_args, result);
  }
  if (callee->type_index != rvm_type_closure)
    return rvm_raise("TypeError", "expected a closure or function to call, but got %s", rvm_type_name(callee));
  const rvm_closure *c = (const rvm_closure *)callee->v_obj;
  if (!vm || c->program != vm->program)
    return rvm_raise("ValueError", "cannot call a closure of another model in this VM");
  if (c->num_captured == 0) return rvm_invoke(vm, c->func_index, args, num_args, result);
  int64_t total = num_args + c->num_captured;
  TVMFFIAny inline_args[RVM_INLINE_ARGS];
  TVMFFIAny *all = total <= RVM_INLINE_ARGS ? inline_args : rvm_mem_alloc(sizeof(TVMFFIAny) * (size_t)total, "call arguments");
  if (!all) return rvm_raise("MemoryError", "out of memory for %lld call arguments", (long long)total);
  if (num_args) memcpy(all, args, sizeof(TVMFFIAny) * (size_t)num_args);
  memcpy(all + num_args, c->captured, sizeof(TVMFFIAny) * (size_t)c->num_captured);
  int rc = rvm_invoke(vm, c->func_index, all, (int32_t)total, result);
  if (all != inline_args) rvm_mem_free(all);
  return rc;
}
