"""cten and NumPy on the same files and the same memory, through ctypes
against the built libcten.so: NumPy reads the .npy/.npz files cten writes,
cten reads the ones numpy.save, numpy.savez and numpy.savez_compressed
write (big-endian, Fortran order, 0-d, empty), and numpy.from_dlpack on a
cten export, and ct_from_dlpack on a NumPy export, see the same memory
(writes through one side are read through the other) and give it back
exactly once. Exits 77 (skipped) without NumPy.

Usage: test_interop.py path/to/libcten.so"""
import ctypes
import gc
import os
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is missing: skipped (Debian: apt-get install python3-numpy)")
    sys.exit(77)

if not hasattr(np, "from_dlpack"):
    print("numpy %s has no from_dlpack (added in 1.22): skipped" % np.__version__)
    sys.exit(77)

lib = ctypes.CDLL(sys.argv[1])
c_int64_p = ctypes.POINTER(ctypes.c_int64)

# ct_dtype values, and the NumPy dtypes they are saved as.
CT_BOOL, CT_I32, CT_I64, CT_F16, CT_BF16, CT_F32, CT_F64 = range(7)
NP_OF = {CT_BOOL: "|b1", CT_I32: "<i4", CT_I64: "<i8", CT_F16: "<f2",
         CT_BF16: "<V2", CT_F32: "<f4", CT_F64: "<f8"}


def fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


class AllocStats(ctypes.Structure):
    _fields_ = [("live_tensors", ctypes.c_int64), ("live_storages", ctypes.c_int64),
                ("live_bytes", ctypes.c_int64)]


P = ctypes.c_void_p
from_data = fn("ct_tensor_from_data", P, P, ctypes.c_int, ctypes.c_int, c_int64_p)
release = fn("ct_tensor_release", None, P)
ndim_of = fn("ct_tensor_ndim", ctypes.c_int, P)
shape_of = fn("ct_tensor_shape", c_int64_p, P)
strides_of = fn("ct_tensor_strides", c_int64_p, P)
dtype_of = fn("ct_tensor_dtype", ctypes.c_int, P)
numel_of = fn("ct_tensor_numel", ctypes.c_int64, P)
data_ptr = fn("ct_tensor_data_ptr", P, P)
copy_to_host = fn("ct_tensor_copy_to_host", ctypes.c_int, P, P, ctypes.c_size_t)
transpose = fn("ct_transpose", P, P, ctypes.c_int, ctypes.c_int)
fill_ = fn("ct_fill_", ctypes.c_int, P, ctypes.c_double)
last_error = fn("ct_last_error", ctypes.c_char_p)
save_npy = fn("ct_save_npy", ctypes.c_int, ctypes.c_char_p, P)
load_npy = fn("ct_load_npy", P, ctypes.c_char_p)
save_npz = fn("ct_save_npz", ctypes.c_int, ctypes.c_char_p, P, ctypes.c_bool)
load_npz = fn("ct_load_npz", P, ctypes.c_char_p)
params_new = fn("ct_params_new", P)
params_free = fn("ct_params_free", None, P)
params_add = fn("ct_params_add", ctypes.c_int, P, ctypes.c_char_p, P)
params_count = fn("ct_params_count", ctypes.c_int64, P)
params_get = fn("ct_params_get", P, P, ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p))
to_dlpack = fn("ct_to_dlpack", P, P)
from_dlpack = fn("ct_from_dlpack", P, P)
alloc_stats = fn("cti_get_alloc_stats", AllocStats)

capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype = ctypes.py_object
capsule_new.argtypes = [P, ctypes.c_char_p, P]
capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
capsule_pointer.restype = P
capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
capsule_set_name.restype = ctypes.c_int
capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
DLTENSOR = b"dltensor"
USED = b"used_dltensor"  # what a consumer renames a capsule it took to

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def ok(t, what):
    if not t:
        raise RuntimeError("%s: %s" % (what, last_error().decode()))
    return t


def cten_from(a, dtype):
    """A cten CPU tensor holding a's values (bf16: a holds the bits as uint16)."""
    a = np.array(a, order="C")  # ascontiguousarray would make a 0-d array 1-d
    shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
    return ok(from_data(a.ctypes.data, dtype, a.ndim, shape), "ct_tensor_from_data")


def host(t):
    """t's elements in row-major order as a NumPy array (bf16 as uint16 bits)."""
    nd = ndim_of(t)
    shape = tuple(shape_of(t)[i] for i in range(nd))
    dt = np.dtype("<u2") if dtype_of(t) == CT_BF16 else np.dtype(NP_OF[dtype_of(t)])
    out = np.empty(shape, dt)
    check(copy_to_host(t, out.ctypes.data, out.nbytes) == 0, "copy_to_host")
    return out


def random_array(dtype, shape, rng):
    return np.array(random_values(dtype, shape, rng))  # 0-d arrays, not NumPy scalars


def random_values(dtype, shape, rng):
    if dtype == CT_BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype in (CT_I32, CT_I64):
        return rng.integers(-2**31, 2**31 - 1, shape).astype(NP_OF[dtype])
    if dtype == CT_BF16:  # bfloat16 bits of random floats: the high half of float32
        return (rng.standard_normal(shape).astype("<f4").view("<u4") >> 16).astype("<u2")
    return rng.standard_normal(shape).astype(NP_OF[dtype])


def as_bits(a):
    """A loaded '<V2' array as uint16, other arrays unchanged."""
    return a.view("<u2") if a.dtype.kind == "V" else a


def test_numpy_reads_cten(tmp, rng):
    for dtype in NP_OF:
        for shape in [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)]:
            a = random_array(dtype, shape, rng)
            t = cten_from(a, dtype)
            path = os.path.join(tmp, "c.npy")
            check(save_npy(path.encode(), t) == 0, "ct_save_npy")
            b = np.load(path)
            want = "|V2" if dtype == CT_BF16 else NP_OF[dtype]  # NumPy's name for '<V2'
            check(b.dtype.str == want, "dtype %s read as %s" % (want, b.dtype.str))
            check(b.shape == shape and np.array_equal(as_bits(b), a),
                  "numpy reads %s %s" % (NP_OF[dtype], shape))
            # A transpose is column-major: saved as is, Fortran order.
            if len(shape) == 2:
                v = ok(transpose(t, 0, 1), "ct_transpose")
                check(save_npy(path.encode(), v) == 0, "ct_save_npy transposed")
                b = np.load(path)
                check(np.array_equal(as_bits(b), a.T) and (b.flags.f_contiguous or a.size == 0),
                      "numpy reads a transposed %s as Fortran order" % NP_OF[dtype])
                release(v)
            release(t)


def test_cten_reads_numpy(tmp, rng):
    path = os.path.join(tmp, "n.npy")
    for dtype in NP_OF:
        if dtype == CT_BF16:
            continue
        for shape in [(), (0,), (7,), (3, 4), (2, 3, 5)]:
            a = random_array(dtype, shape, rng)
            for order in ["<", ">"]:
                for fortran in [False, True]:
                    b = a.astype(a.dtype.newbyteorder(order)) if a.dtype.itemsize > 1 else a
                    b = np.array(b, order="F" if fortran else "C")
                    np.save(path, b)
                    t = load_npy(path.encode())
                    what = "cten reads numpy's %s %s fortran=%s" % (b.dtype.str, shape, fortran)
                    check(t is not None, what + ": " + last_error().decode())
                    if t:
                        check(dtype_of(t) == dtype and np.array_equal(host(t), a), what)
                        release(t)
    # bfloat16 as NumPy has it: two-byte voids.
    bits = random_array(CT_BF16, (4, 3), rng)
    np.save(path, bits.view("V2"))
    t = ok(load_npy(path.encode()), "ct_load_npy V2")
    check(dtype_of(t) == CT_BF16 and np.array_equal(host(t), bits), "cten reads V2 as bfloat16")
    release(t)


def npz_list(arrays):
    p = params_new()
    for name, (a, dtype) in arrays.items():
        t = cten_from(a, dtype)
        check(params_add(p, name.encode(), t) == 0, "ct_params_add")
        release(t)
    return p


def test_npz(tmp, rng):
    arrays = {"w": random_array(CT_F32, (3, 4), rng), "b": random_array(CT_F64, (4,), rng),
              "mask": random_array(CT_BOOL, (2, 2), rng), "i": random_array(CT_I64, (), rng),
              "empty": random_array(CT_F16, (0, 3), rng), "na\u00efve": random_array(CT_I32, (5,), rng)}
    dtypes = {"w": CT_F32, "b": CT_F64, "mask": CT_BOOL, "i": CT_I64, "empty": CT_F16,
              "na\u00efve": CT_I32}
    path = os.path.join(tmp, "a.npz")
    for save in [np.savez, np.savez_compressed]:
        save(path, **arrays)
        p = load_npz(path.encode())
        check(p is not None, "cten reads %s: %s" % (save.__name__, last_error().decode()))
        if not p:
            continue
        check(params_count(p) == len(arrays), "%s member count" % save.__name__)
        for i in range(params_count(p)):
            name = ctypes.c_char_p()
            t = params_get(p, i, ctypes.byref(name))
            key = name.value.decode()
            check(key in arrays and dtype_of(t) == dtypes[key] and
                  np.array_equal(host(t), arrays[key]), "%s member %s" % (save.__name__, key))
        params_free(p)
    p = npz_list({k: (a, dtypes[k]) for k, a in arrays.items()})
    for compress in [False, True]:
        check(save_npz(path.encode(), p, compress) == 0, "ct_save_npz")
        with np.load(path) as z:
            check(sorted(z.files) == sorted(arrays), "numpy lists cten's npz members")
            for k, a in arrays.items():
                check(np.array_equal(z[k], a), "numpy reads cten's npz member %s (compress=%s)"
                      % (k, compress))
    params_free(p)


class Exported:
    """What numpy.from_dlpack asks for: a capsule and the device."""

    def __init__(self, managed):
        self.capsule = capsule_new(managed, DLTENSOR, None)

    def __dlpack__(self, stream=None):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def test_dlpack_to_numpy(rng):
    base = alloc_stats().live_storages
    for dtype in [CT_I32, CT_I64, CT_F16, CT_F32, CT_F64]:
        a = random_array(dtype, (4, 6), rng)
        t = cten_from(a, dtype)
        v = ok(transpose(t, 0, 1), "ct_transpose")  # strides (1, 6)
        arr = np.from_dlpack(Exported(ok(to_dlpack(v), "ct_to_dlpack")))
        check(arr.ctypes.data == data_ptr(v), "numpy's array starts at cten's element 0")
        check(np.array_equal(arr, a.T), "numpy sees cten's %s values" % NP_OF[dtype])
        # NumPy < 1.25 marks arrays from DLPack read-only (DLPack 0.x had no
        # flag for it), so the write goes to the address NumPy's array has.
        ctypes.memmove(arr.ctypes.data + arr.strides[0] + 2 * arr.strides[1],
                       np.array(7, arr.dtype).tobytes(), arr.itemsize)
        check(host(t)[2, 1] == 7, "... read by cten (%s)" % NP_OF[dtype])
        check(fill_(t, 3) == 0, "ct_fill_")  # written by cten ...
        check(np.all(arr == 3), "... read by NumPy (%s)" % NP_OF[dtype])
        release(v)
        release(t)
        check(alloc_stats().live_storages == base + 1, "the export keeps the storage alive")
        del arr
        gc.collect()
        check(alloc_stats().live_storages == base, "numpy's release gives the storage back")


def test_numpy_to_cten(rng):
    for dt in ["<f4", "<f8", "<i4", "<i8", "<f2"]:
        a = rng.standard_normal((5, 8)).astype(dt)
        view = a[1:, ::2]  # an offset and strides
        refs = sys.getrefcount(view)
        capsule = view.__dlpack__()
        t = from_dlpack(capsule_pointer(capsule, DLTENSOR))
        check(t is not None, "ct_from_dlpack on numpy's %s: %s" % (dt, last_error().decode()))
        if not t:
            continue
        capsule_set_name(capsule, USED)  # cten owns it now
        del capsule
        check(data_ptr(t) == view.ctypes.data, "cten's tensor starts at numpy's element 0")
        check([strides_of(t)[i] for i in range(2)] == [8, 2], "strides in elements")
        check(np.array_equal(host(t), view), "cten sees numpy's %s values" % dt)
        check(fill_(t, 5) == 0, "ct_fill_")
        check(np.all(view == 5) and np.all(a[0] != 5), "numpy sees cten's writes, only there")
        check(sys.getrefcount(view) > refs, "cten holds numpy's export")
        release(t)
        gc.collect()
        check(sys.getrefcount(view) == refs, "cten called numpy's deleter (%s)" % dt)


def main():
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    with tempfile.TemporaryDirectory() as tmp:
        test_numpy_reads_cten(tmp, rng)
        test_cten_reads_numpy(tmp, rng)
        test_npz(tmp, rng)
    test_dlpack_to_numpy(rng)
    test_numpy_to_cten(rng)
    if failures:
        print("%d failures" % len(failures))
        sys.exit(1)
    print("numpy %s: all interop checks passed" % np.__version__)


main()
