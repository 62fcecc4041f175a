/* datapipe._normalize: one uint8 CHW image -> its normalized row of an output batch, by table.

A uint8 channel value has 256 possible results, so the normalized value of each is computed once
(by torch, with the batch path's own operations: see datapipe/backends/normalize.py) and the image
is mapped through that table: one read of the pixels and one write of the row, with the GIL
released, instead of torch's three passes (cast, multiply, add). The table's items are copied bit
for bit (4 bytes for float32, 2 for bfloat16 and float16), so the values are the batch path's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LUT_ENTRIES (3 * 256)

#define MAP_PLANES(T)                                                                              \
    do {                                                                                           \
        const T *table = (const T *)lut;                                                           \
        T *out = (T *)dst;                                                                         \
        const uint8_t *r = src, *g = src + plane, *b = src + 2 * plane;                            \
        for (Py_ssize_t i = 0; i < plane; i++) {                                                   \
            out[i] = table[r[i]];                                                                  \
            out[plane + i] = table[256 + g[i]];                                                    \
            out[2 * plane + i] = table[512 + b[i]];                                                \
        }                                                                                          \
    } while (0)

#define MAP_INTERLEAVED(T)                                                                         \
    do {                                                                                           \
        const T *table = (const T *)lut;                                                           \
        T *out = (T *)dst;                                                                         \
        const uint8_t *r = src, *g = src + plane, *b = src + 2 * plane;                            \
        for (Py_ssize_t i = 0; i < plane; i++) {                                                   \
            out[3 * i] = table[r[i]];                                                              \
            out[3 * i + 1] = table[256 + g[i]];                                                    \
            out[3 * i + 2] = table[512 + b[i]];                                                    \
        }                                                                                          \
    } while (0)

static void map_image(const uint8_t *src, void *dst, const void *lut, Py_ssize_t plane,
                      Py_ssize_t itemsize, int channels_last) {
    if (itemsize == 4) {
        if (channels_last) MAP_INTERLEAVED(uint32_t); else MAP_PLANES(uint32_t);
    } else {
        if (channels_last) MAP_INTERLEAVED(uint16_t); else MAP_PLANES(uint16_t);
    }
}

static PyObject *normalize_into(PyObject *self, PyObject *args) {
    Py_buffer src, dst, lut;
    int channels_last;
    if (!PyArg_ParseTuple(args, "y*w*y*p", &src, &dst, &lut, &channels_last)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t itemsize = lut.len / LUT_ENTRIES;
    if (lut.len % LUT_ENTRIES || (itemsize != 2 && itemsize != 4)) {
        PyErr_Format(PyExc_ValueError, "the table must hold 3 x 256 items of 2 or 4 bytes, got %zd bytes", lut.len);
    } else if (src.len % 3) {
        PyErr_Format(PyExc_ValueError, "the image must hold 3 planes, got %zd bytes", src.len);
    } else if (dst.len != src.len * itemsize) {
        PyErr_Format(PyExc_ValueError, "the row must hold %zd bytes for a %zd-byte image, got %zd",
                     src.len * itemsize, src.len, dst.len);
    } else {
        Py_BEGIN_ALLOW_THREADS
        map_image((const uint8_t *)src.buf, dst.buf, lut.buf, src.len / 3, itemsize, channels_last);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&lut);
    return result;
}

static PyMethodDef methods[] = {
    {"normalize_into", normalize_into, METH_VARARGS,
     "normalize_into(image, row, table, channels_last): map a contiguous uint8 CHW image through table "
     "(3 x 256 items of 2 or 4 bytes, one row per channel) into row (contiguous: CHW, or HWC when "
     "channels_last)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_normalize", NULL, -1, methods};

PyMODINIT_FUNC PyInit__normalize(void) { return PyModule_Create(&module); }
