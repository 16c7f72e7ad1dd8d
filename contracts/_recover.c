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

static PyObject *recover(PyObject *self, PyObject *args) {
    const unsigned char *digest, *signature;
    Py_ssize_t digest_len, signature_len;
    if (!PyArg_ParseTuple(args, "y#y#:recover", &digest, &digest_len, &signature, &signature_len))
        return NULL;
    if (digest_len != 32 || signature_len != 65) {
        PyErr_SetString(PyExc_ValueError, "digest must be 32 bytes and signature 65");
        return NULL;
    }
    int recid = signature[64] - 27;
    if (recid != 0 && recid != 1) {
        PyErr_SetString(PyExc_ValueError, "signature v must be 27 or 28");
        return NULL;
    }
    unsigned char out[65];
    size_t out_len = sizeof out;
    int failed = 0;
    secp256k1_ecdsa_recoverable_signature parsed;
    secp256k1_pubkey public;
    Py_BEGIN_ALLOW_THREADS
    if (!parse_compact(context, &parsed, signature, recid))
        failed = 1;
    else if (!ecdsa_recover(context, &public, &parsed, digest))
        failed = 2;
    else
        pubkey_serialize(context, out, &out_len, &public, EC_UNCOMPRESSED);
    Py_END_ALLOW_THREADS
    if (failed == 1) {
        PyErr_SetString(PyExc_ValueError, "signature does not recover: r or s is out of range");
        return NULL;
    }
    if (failed == 2) {
        PyErr_SetString(PyExc_ValueError, "signature does not recover: no public key signed it");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_len);
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
