/* secp256k1 public key recovery in one call that lets go of the interpreter lock once.
 *
 * coincurve's bindings make three library calls per recovery (parse the signature, recover,
 * serialize the key), and each lets go of the interpreter lock and takes it back: on a server
 * whose threads verify orders side by side, every return waits for whichever thread holds the
 * lock. This module makes the same three calls of the same library (the libsecp256k1 coincurve
 * ships, found through its loaded module; no second copy and no headers needed) with the lock
 * let go once, around all three.
 *
 * recover(digest, signature) -> bytes: the 65-byte uncompressed public key (0x04 first) that
 * signed the 32-byte `digest`; `signature` is 65 bytes r || s || v with v in {27, 28}. Raises
 * ValueError when it does not recover. The caller (contracts.signing) checks lengths, v and low s
 * first; they are checked here again, as no call may read out of bounds.
 *
 * recover_many(pairs) -> list: for a list of (digest, signature) tuples, each one's key, or in
 * its place 1 (r or s out of range) or 2 (no key signed it); the lock let go once for them all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

/* libsecp256k1's types, opaque and of fixed size by its API (include/secp256k1.h). */
typedef struct secp256k1_context_struct secp256k1_context;
typedef struct {
    unsigned char data[64];
} secp256k1_pubkey;
typedef struct {
    unsigned char data[65];
} secp256k1_ecdsa_recoverable_signature;

#define CONTEXT_VERIFY ((1 << 0) | (1 << 8))
#define EC_UNCOMPRESSED (1 << 1)

static secp256k1_context *(*context_create)(unsigned int);
static int (*parse_compact)(const secp256k1_context *, secp256k1_ecdsa_recoverable_signature *,
                            const unsigned char *, int);
static int (*ecdsa_recover)(const secp256k1_context *, secp256k1_pubkey *,
                            const secp256k1_ecdsa_recoverable_signature *, const unsigned char *);
static int (*pubkey_serialize)(const secp256k1_context *, unsigned char *, size_t *,
                               const secp256k1_pubkey *, unsigned int);
static secp256k1_context *context;

/* 0 and the key in out, or 1 (r or s out of range) or 2 (no key); the lock is not needed. */
static int recover_one(const unsigned char *digest, const unsigned char *signature,
                       unsigned char *out) {
    secp256k1_ecdsa_recoverable_signature parsed;
    secp256k1_pubkey public;
    size_t out_len = 65;
    if (!parse_compact(context, &parsed, signature, signature[64] - 27))
        return 1;
    if (!ecdsa_recover(context, &public, &parsed, digest))
        return 2;
    pubkey_serialize(context, out, &out_len, &public, EC_UNCOMPRESSED);
    return 0;
}

static PyObject *failure(int code) {
    PyErr_SetString(PyExc_ValueError,
                    code == 1 ? "signature does not recover: r or s is out of range"
                              : "signature does not recover: no public key signed it");
    return NULL;
}

static PyObject *recover(PyObject *self, PyObject *args) {
    PyObject *digest_bytes, *signature_bytes;
    /* bytes only: immutable, so nothing changes them while the lock is let go */
    if (!PyArg_ParseTuple(args, "SS:recover", &digest_bytes, &signature_bytes))
        return NULL;
    const unsigned char *digest = (const unsigned char *)PyBytes_AS_STRING(digest_bytes);
    const unsigned char *signature = (const unsigned char *)PyBytes_AS_STRING(signature_bytes);
    if (PyBytes_GET_SIZE(digest_bytes) != 32 || PyBytes_GET_SIZE(signature_bytes) != 65) {
        PyErr_SetString(PyExc_ValueError, "digest must be 32 bytes and signature 65");
        return NULL;
    }
    int recid = signature[64] - 27;
    if (recid != 0 && recid != 1) {
        PyErr_SetString(PyExc_ValueError, "signature v must be 27 or 28");
        return NULL;
    }
    unsigned char out[65];
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = recover_one(digest, signature, out);
    Py_END_ALLOW_THREADS
    if (failed)
        return failure(failed);
    return PyBytes_FromStringAndSize((const char *)out, 65);
}

/* One pair's 32 + 65 bytes, copied while the lock is held, and its outcome. */
typedef struct {
    unsigned char digest[32];
    unsigned char signature[65];
    unsigned char out[65];
    int failed;
} pair_t;

static PyObject *recover_many(PyObject *self, PyObject *pairs) {
    if (!PyList_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "recover_many takes a list of (digest, signature)");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(pairs);
    pair_t *work = PyMem_RawMalloc(count > 0 ? (size_t)count * sizeof(pair_t) : 1);
    if (work == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(pairs, i);
        const char *digest, *signature;
        Py_ssize_t digest_len, signature_len;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(item, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
            PyMem_RawFree(work);
            PyErr_SetString(PyExc_TypeError, "each pair must be (bytes, bytes)");
            return NULL;
        }
        PyBytes_AsStringAndSize(PyTuple_GET_ITEM(item, 0), (char **)&digest, &digest_len);
        PyBytes_AsStringAndSize(PyTuple_GET_ITEM(item, 1), (char **)&signature, &signature_len);
        if (digest_len != 32 || signature_len != 65 ||
            ((unsigned char)signature[64] != 27 && (unsigned char)signature[64] != 28)) {
            PyMem_RawFree(work);
            PyErr_SetString(PyExc_ValueError,
                            "digest must be 32 bytes and signature 65 with v 27 or 28");
            return NULL;
        }
        memcpy(work[i].digest, digest, 32);
        memcpy(work[i].signature, signature, 65);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        work[i].failed = recover_one(work[i].digest, work[i].signature, work[i].out);
    Py_END_ALLOW_THREADS
    PyObject *result = PyList_New(count);
    for (Py_ssize_t i = 0; result != NULL && i < count; i++) {
        PyObject *value = work[i].failed ? PyLong_FromLong(work[i].failed)
                                         : PyBytes_FromStringAndSize((char *)work[i].out, 65);
        if (value == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, i, value);
    }
    PyMem_RawFree(work);
    return result;
}

static void *symbol(void *library, const char *name) {
    void *found = dlsym(library, name);
    if (found == NULL)
        PyErr_Format(PyExc_ImportError, "libsecp256k1 has no %s", name);
    return found;
}

static int bind(void) {
    PyObject *bindings = PyImport_ImportModule("coincurve._libsecp256k1");
    if (bindings == NULL)
        return -1;
    PyObject *path = PyObject_GetAttrString(bindings, "__file__");
    Py_DECREF(bindings);
    if (path == NULL)
        return -1;
    const char *text = PyUnicode_AsUTF8(path);
    void *library = text == NULL ? NULL : dlopen(text, RTLD_NOW | RTLD_LOCAL);
    if (text != NULL && library == NULL)
        PyErr_Format(PyExc_ImportError, "cannot open %s: %s", text, dlerror());
    Py_DECREF(path);
    if (library == NULL)
        return -1;
    /* The handle stays open for the process's life: the library is coincurve's, loaded anyway. */
    if ((*(void **)&context_create = symbol(library, "secp256k1_context_create")) == NULL ||
        (*(void **)&parse_compact =
             symbol(library, "secp256k1_ecdsa_recoverable_signature_parse_compact")) == NULL ||
        (*(void **)&ecdsa_recover = symbol(library, "secp256k1_ecdsa_recover")) == NULL ||
        (*(void **)&pubkey_serialize = symbol(library, "secp256k1_ec_pubkey_serialize")) == NULL)
        return -1;
    context = context_create(CONTEXT_VERIFY);
    if (context == NULL) {
        PyErr_SetString(PyExc_ImportError, "libsecp256k1 made no context");
        return -1;
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"recover", recover, METH_VARARGS,
     "recover(digest, signature) -> the 65-byte public key that signed digest"},
    {"recover_many", recover_many, METH_O,
     "recover_many([(digest, signature), ...]) -> each key, or 1 or 2 where none recovers"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "contracts._recover",
    "secp256k1 public key recovery with the interpreter lock let go once.", -1, methods,
};

PyMODINIT_FUNC PyInit__recover(void) {
    if (bind() < 0)
        return NULL;
    return PyModule_Create(&module);
}
