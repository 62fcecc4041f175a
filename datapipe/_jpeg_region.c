/* Decode one region of a JPEG with the system libjpeg-turbo (>= 1.5): only the rows and iMCU
 * columns the region needs go through IDCT, upsampling and colour conversion, and rows below it are
 * never entropy-decoded (jpeg_crop_scanline + jpeg_skip_scanlines, the calls libjpeg-turbo 3's
 * tj3SetCroppingRegion makes). The pixels equal a full decode's (ISLOW DCT, fancy upsampling, the
 * defaults of simplejpeg and Pillow) cut to the region: tests/test_jpeg_region.py checks them.
 *
 * decode_region(data, scale_denom, left, top, width, height, out) writes height x width x 3 RGB
 * bytes, rows packed, to the start of `out`, which must hold region_buffer_size(width, height)
 * bytes (scratch room for the margin). Coordinates are in the image scaled by 1/scale_denom.
 * A CMYK or YCCK JPEG is decoded to CMYK and turned into RGB as Pillow does (Pillow reads a JPEG's
 * CMYK as Adobe-inverted, "CMYK;I", then converts: cmyk_row_to_rgb; tests compare with Pillow).
 * A libjpeg error raises ValueError. Its warnings (corrupt entropy data, which libjpeg decodes
 * past) are ignored, as Pillow ignores them, and so is a missing end: the rows below the region are
 * never read, so the caller checks for the EOI marker (datapipe.augment.view.region_decoding). The GIL
 * is released while decoding. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

/* Columns decoded on each side of the region: at the edge of a decoded strip fancy upsampling
 * replicates pixels instead of reading the neighbours a full decode reads. */
#define MARGIN 16
/* Extra columns jpeg_crop_scanline may add when it moves the left edge to an iMCU boundary. */
#define ALIGN_SLACK 64
#define ROWS_PER_CALL 32

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} ErrorTrap;

static void trap_error(j_common_ptr cinfo) {
    ErrorTrap *trap = (ErrorTrap *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, trap->message);
    longjmp(trap->escape, 1);
}

static void ignore_message(j_common_ptr cinfo, int level) {
    (void)cinfo; /* warnings and trace messages: libjpeg's default prints them to stderr */
    (void)level;
}

static Py_ssize_t buffer_size(int width, int height) {
    return (Py_ssize_t)height * ((Py_ssize_t)width + 2 * MARGIN + ALIGN_SLACK) * 3; /* no int overflow */
}

/* Pillow's CMYK -> RGB (Convert.c cmyk2rgb) applied to libjpeg's raw CMYK, which Pillow inverts
 * first: with c = 255 - raw c and nk = 255 - k = raw k, each channel is nk - c * nk / 255, rounded
 * as Pillow's MULDIV255. */
static void cmyk_row_to_rgb(const unsigned char *in, unsigned char *out, JDIMENSION width) {
    for (JDIMENSION x = 0; x < width; x++, in += 4, out += 3) {
        int nk = in[3];
        for (int i = 0; i < 3; i++) {
            int tmp = (255 - in[i]) * nk + 128;
            int v = nk - (((tmp >> 8) + tmp) >> 8);
            out[i] = (unsigned char)(v < 0 ? 0 : v);
        }
    }
}

/* Up to `want` rows from scanline `done` on into the RGB strip at `out` (stride bytes a row), through
 * `cmyk` scratch rows when the JPEG is CMYK. */
static void read_rows(struct jpeg_decompress_struct *cinfo, JSAMPARRAY cmyk, unsigned char *out, size_t stride,
                      int done, int want) {
    JSAMPROW rows[ROWS_PER_CALL];
    for (int i = 0; i < want; i++) rows[i] = cmyk ? cmyk[i] : out + (size_t)(done + i) * stride;
    JDIMENSION got = jpeg_read_scanlines(cinfo, rows, (JDIMENSION)want);
    for (JDIMENSION i = 0; cmyk && i < got; i++)
        cmyk_row_to_rgb(cmyk[i], out + (size_t)(done + (int)i) * stride, cinfo->output_width);
}

/* The region's rows, packed; NULL on success, else the reason. Runs without the GIL. */
static const char *decode(struct jpeg_decompress_struct *cinfo, ErrorTrap *trap, const Py_buffer *src,
                          int denom, int left, int top, int width, int height, unsigned char *out) {
    if (setjmp(trap->escape)) return trap->message;
    jpeg_create_decompress(cinfo); /* may fail too (a header/library version mismatch) */
    jpeg_mem_src(cinfo, (const unsigned char *)src->buf, (unsigned long)src->len);
    jpeg_read_header(cinfo, TRUE);
    int is_cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
    cinfo->out_color_space = is_cmyk ? JCS_CMYK : JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = denom;
    cinfo->dct_method = JDCT_ISLOW;
    jpeg_start_decompress(cinfo);
    int full_width = (int)cinfo->output_width;
    if ((long long)left + width > full_width || (long long)top + height > (long long)cinfo->output_height)
        return "region outside the scaled image";

    int x0 = left > MARGIN ? left - MARGIN : 0;
    int x1 = left + width + MARGIN < full_width ? left + width + MARGIN : full_width;
    JDIMENSION strip_left = (JDIMENSION)x0, strip_width = (JDIMENSION)(x1 - x0);
    jpeg_crop_scanline(cinfo, &strip_left, &strip_width);
    size_t stride = (size_t)strip_width * 3, row_bytes = (size_t)width * 3;
    if (stride > (size_t)(width + 2 * MARGIN + ALIGN_SLACK) * 3) return "iMCU wider than the buffer slack";
    if (top > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)top);

    JSAMPARRAY cmyk = NULL; /* freed with the decompressor (jpeg_destroy), also after an error */
    if (is_cmyk)
        cmyk = (*cinfo->mem->alloc_sarray)((j_common_ptr)cinfo, JPOOL_IMAGE, strip_width * 4, ROWS_PER_CALL);
    while ((int)cinfo->output_scanline < top + height) {
        int done = (int)cinfo->output_scanline - top, want = top + height - (int)cinfo->output_scanline;
        if (want > ROWS_PER_CALL) want = ROWS_PER_CALL;
        read_rows(cinfo, cmyk, out, stride, done, want);
    }
    size_t shift = (size_t)(left - (int)strip_left) * 3;
    if (stride != row_bytes || shift)
        for (int y = 0; y < height; y++) /* pack the rows: each moves down, never onto an unread one */
            memmove(out + (size_t)y * row_bytes, out + (size_t)y * stride + shift, row_bytes);
    return NULL;
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int denom, left, top, width, height;
    if (!PyArg_ParseTuple(args, "y*iiiiiw*", &src, &denom, &left, &top, &width, &height, &dst)) return NULL;
    const char *problem = NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8)
        problem = "scale_denom must be 1, 2, 4 or 8";
    else if (left < 0 || top < 0 || width <= 0 || height <= 0)
        problem = "region must have left, top >= 0 and width, height > 0";
    else if (dst.len < buffer_size(width, height))
        problem = "output buffer smaller than region_buffer_size(width, height)";
    if (!problem) {
        struct jpeg_decompress_struct cinfo;
        ErrorTrap trap;
        memset(&cinfo, 0, sizeof cinfo); /* cinfo.mem == NULL: jpeg_destroy is safe if create fails */
        cinfo.err = jpeg_std_error(&trap.pub);
        trap.pub.error_exit = trap_error;
        trap.pub.emit_message = ignore_message;
        trap.message[0] = '\0';
        Py_BEGIN_ALLOW_THREADS
        problem = decode(&cinfo, &trap, &src, denom, left, top, width, height, (unsigned char *)dst.buf);
        Py_END_ALLOW_THREADS
        jpeg_destroy_decompress(&cinfo);
        if (problem) PyErr_SetString(PyExc_ValueError, problem); /* before trap goes out of scope */
    } else {
        PyErr_SetString(PyExc_ValueError, problem);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (problem) return NULL;
    Py_RETURN_NONE;
}

static PyObject *region_buffer_size(PyObject *self, PyObject *args) {
    int width, height;
    if (!PyArg_ParseTuple(args, "ii", &width, &height)) return NULL;
    return PyLong_FromSsize_t(buffer_size(width, height));
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_denom, left, top, width, height, out): RGB rows of one region into out."},
    {"region_buffer_size", region_buffer_size, METH_VARARGS,
     "region_buffer_size(width, height): the bytes decode_region's out must hold."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region",
                                    "Region (crop) JPEG decode with libjpeg-turbo.", -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *m = PyModule_Create(&module);
    if (m) PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION);
    return m;
}
