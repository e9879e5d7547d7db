/*
 * rvm_kernel.h: the kernel ABI of relaxc models, binary compatible with TVM-FFI 0.1.x.
 *
 * Kernels linked into a model (TVM's lib0.o, or C sources given to relaxc) are called through the
 * TVM-FFI "safe call" convention and see values, objects and tensors in exactly TVM's layouts, so
 * TVM-built kernels run unchanged and kernels written against this header also load in TVM.
 * A kernel named NAME exports `int __tvm_ffi_NAME(void *self, const TVMFFIAny *args,
 * int32_t num_args, TVMFFIAny *result)`, returns 0 on success, and on failure calls
 * TVMFFIErrorSetRaisedFromCStrParts and returns -1. Arguments are borrowed views: a kernel never
 * retains or releases them.
 */
#ifndef RVM_KERNEL_H
#define RVM_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DLPack 1.x structures (layouts fixed by the DLPack ABI) ---------------------------- */
#ifndef DLPACK_VERSION
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 3

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLCUDAManaged = 13,
} DLDeviceType;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
} DLDataTypeCode;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* NULL means compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

/* ---- TVM-FFI values --------------------------------------------------------------------- */

/* Type indices of TVMFFIAny.type_index. Indices >= kTVMFFIStaticObjectBegin are objects. */
enum {
  kTVMFFINone = 0,
  kTVMFFIInt = 1,
  kTVMFFIBool = 2,
  kTVMFFIFloat = 3,
  kTVMFFIOpaquePtr = 4,
  kTVMFFIDataType = 5,
  kTVMFFIDevice = 6,
  kTVMFFIDLTensorPtr = 7,
  kTVMFFIRawStr = 8,
  kTVMFFIByteArrayPtr = 9,
  kTVMFFIObjectRValueRef = 10,
  kTVMFFISmallStr = 11,
  kTVMFFISmallBytes = 12,
  kTVMFFIStaticObjectBegin = 64,
  kTVMFFIObject = 64,
  kTVMFFIStr = 65,
  kTVMFFIBytes = 66,
  kTVMFFIError = 67,
  kTVMFFIFunction = 68,
  kTVMFFIShape = 69,
  kTVMFFITensor = 70,
  kTVMFFIArray = 71,
  kTVMFFIMap = 72,
  kTVMFFIModule = 73,
};

struct TVMFFIObject;

/* A 16-byte value cell. As an argument it is a borrowed view; as a result it owns its object. */
typedef struct TVMFFIAny {
  int32_t type_index;
  uint32_t zero_padding; /* small_str_len for SmallStr / SmallBytes */
  union {
    int64_t v_int64;
    double v_float64;
    void *v_ptr;
    const char *v_c_str;
    struct TVMFFIObject *v_obj;
    DLDataType v_dtype;
    DLDevice v_device;
    char v_bytes[8];
  };
} TVMFFIAny;

/* The header every reference-counted object starts with (24 bytes). */
typedef struct TVMFFIObject {
  uint64_t combined_ref_count; /* strong count in the low 32 bits, weak count in the high 32 */
  int32_t type_index;
  uint32_t padding;
  void (*deleter)(void *self, int flags); /* flags: 1 strong, 2 weak, 3 both reached zero */
} TVMFFIObject;

/* Body of a Shape object (type 69), right after the header. */
typedef struct {
  const int64_t *data;
  uint64_t size;
} TVMFFIShapeCell;

/* Body of a Str/Bytes object (types 65/66), right after the header. */
typedef struct {
  const char *data;
  uint64_t size;
} TVMFFIByteArray;

/* Body of an Array object (type 71): owned TVMFFIAny elements at data[0..size). */
typedef struct {
  void *data;
  int64_t size;
  int64_t capacity;
  void (*data_deleter)(void *);
} TVMFFISeqCell;

typedef int (*TVMFFISafeCallType)(void *self, const TVMFFIAny *args, int32_t num_args,
                                  TVMFFIAny *result);

/* Body of a Function object (type 68). */
typedef struct {
  TVMFFISafeCallType safe_call;
  void *cpp_call; /* always NULL in relaxc */
} TVMFFIFunctionCell;

/* The DLTensor of a Tensor object (type 70) sits right after the object header. */
static inline DLTensor *rvm_tensor_of_object(TVMFFIObject *obj) {
  return (DLTensor *)((char *)obj + sizeof(TVMFFIObject));
}

/* Records an error for the caller of the current safe call: the message is the concatenation of
 * the non-NULL parts. Strings are copied; the kernel then returns -1. Thread-safe. */
void TVMFFIErrorSetRaisedFromCStrParts(const char *kind, const char **parts, int32_t num_parts);

/* Same with a single message string. */
void TVMFFIErrorSetRaisedFromCStr(const char *kind, const char *message);

/* Finds the global function `name` (a runtime function such as tvm.contrib.sort.sort, or one
 * the host registered through rvm.h) and stores a borrowed handle in *out: it stays valid while
 * the library is loaded, so a kernel may cache it. library_ctx is ignored (pass NULL). Returns
 * -1 with TVM's "Cannot find function" error when nobody provides the name. */
int TVMFFIEnvModLookupFromImports(void *library_ctx, const char *name, void **out);

/* Calls a function handle from TVMFFIEnvModLookupFromImports with borrowed arguments; *result
 * (None on entry) is owned by the caller afterwards. */
int TVMFFIFunctionCall(void *func, TVMFFIAny *args, int32_t num_args, TVMFFIAny *result);

#ifdef __cplusplus
}
#endif
#endif /* RVM_KERNEL_H */
