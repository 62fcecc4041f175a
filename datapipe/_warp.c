/* datapipe._warp: PIL's Image.transform(AFFINE, BILINEAR) on a uint8 CHW image, in one pass: the same
values as Pillow's (libImaging/Geometry.c: affine_transform, BILINEAR_HEAD/BODY, bilinear_filter32RGB).

The output pixel centred at (x + 0.5, y + 0.5) takes the input at the continuous point
(u, v) = (a x' + b y' + c, d x' + e y' + f), x' = x + 0.5, y' = y + 0.5 (pixel i spans [i, i + 1]);
a pixel whose point falls outside [0, width) x [0, height) gets the fill colour; inside, the four
pixel centres around (u - 0.5, v - 0.5) are blended bilinearly (a + (b - a) d along x, then along y),
taps clamped to the image, in double precision, and the result truncated to uint8 as Pillow's
(UINT8) cast does. The GIL is released. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static inline double clamp(double value, double low, double high) {
    return value < low ? low : (value > high ? high : value);
}

/* A blend of levels 0..255 as Pillow stores it: truncated. */
static inline uint8_t to_level(double value) {
    return (uint8_t)(value < 0 ? 0 : (value > 255 ? 255 : value));
}

static void warp(const uint8_t *src, uint8_t *dst, Py_ssize_t width, Py_ssize_t height, const double *m,
                 const int *fill) {
    const Py_ssize_t plane = width * height;
    const uint8_t *planes[3] = {src, src + plane, src + 2 * plane};
    for (Py_ssize_t y = 0; y < height; y++) {
        const double yc = y + 0.5;
        for (Py_ssize_t x = 0; x < width; x++) {
            const double xc = x + 0.5;
            const double u = m[0] * xc + m[1] * yc + m[2], v = m[3] * xc + m[4] * yc + m[5];
            const Py_ssize_t at = y * width + x;
            if (!(u >= 0 && u < width && v >= 0 && v < height)) {
                for (int ch = 0; ch < 3; ch++) dst[ch * plane + at] = (uint8_t)fill[ch];
                continue;
            }
            const double ix = clamp(u - 0.5, 0, width - 1), iy = clamp(v - 0.5, 0, height - 1);
            const Py_ssize_t x0 = (Py_ssize_t)ix, y0 = (Py_ssize_t)iy;
            const Py_ssize_t dx = x0 + 1 < width, dy = y0 + 1 < height ? width : 0;
            const double wx = ix - x0, wy = iy - y0;
            const Py_ssize_t corner = y0 * width + x0;
            for (int ch = 0; ch < 3; ch++) {
                const uint8_t *p = planes[ch] + corner;
                const double top = p[0] + wx * (p[dx] - p[0]);
                const double bottom = p[dy] + wx * (p[dy + dx] - p[dy]);
                dst[ch * plane + at] = to_level(top + wy * (bottom - top));
            }
        }
    }
}

static PyObject *warp_affine(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t width, height;
    double m[6];
    int fill[3];
    if (!PyArg_ParseTuple(args, "y*w*nn(dddddd)(iii)", &src, &dst, &width, &height, &m[0], &m[1], &m[2], &m[3],
                          &m[4], &m[5], &fill[0], &fill[1], &fill[2]))
        return NULL;
    PyObject *result = NULL;
    if (width < 1 || height < 1 || width > PY_SSIZE_T_MAX / 3 / height || src.len != 3 * width * height ||
        dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "a 3 x %zd x %zd uint8 image and an output of its size are needed, got %zd "
                     "and %zd bytes", height, width, src.len, dst.len);
    } else {
        for (int ch = 0; ch < 3; ch++) fill[ch] = fill[ch] < 0 ? 0 : (fill[ch] > 255 ? 255 : fill[ch]);
        Py_BEGIN_ALLOW_THREADS
        warp((const uint8_t *)src.buf, (uint8_t *)dst.buf, width, height, m, fill);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"warp_affine", warp_affine, METH_VARARGS,
     "warp_affine(image, out, width, height, (a, b, c, d, e, f), (r, g, b)): PIL's AFFINE transform of a "
     "contiguous uint8 3 x height x width image into out (the same size), bilinear, fill outside, Pillow's values."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_warp", NULL, -1, methods};

PyMODINIT_FUNC PyInit__warp(void) { return PyModule_Create(&module); }
