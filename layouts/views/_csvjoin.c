/* Lines of table text joined from column texts, at memory speed.
 *
 * Owns the two loops of layouts.views._csvblock (whose docstring defines the
 * texts) that run over every byte: scan, which checks a NUL-padded byte
 * matrix of texts (ASCII, no NUL inside) and measures them, and
 * join(columns, rows, size, sep, end) -> bytes, the loop of block_bytes.
 *
 * join: each column gives the texts of rows [0, rows) as a pair
 * (buffer, width):
 *
 *   width == 0: a JSON array as orjson writes one of numbers, "[t0,t1,...]":
 *               the texts are what lies between the brackets and commas,
 *               less any NUL bytes at their end (a text shorter than the
 *               one it was written over; a NUL elsewhere is an error);
 *   width > 0:  a C-contiguous (rows, width) byte matrix, each text
 *               left-aligned and padded with NUL bytes.
 *
 * Line i is the columns' texts of row i, `sep` after each but the last and
 * `end` after the last. `size` is the length the caller counted for the
 * lines; the bytes are made in a buffer of exactly that length, and a
 * column whose texts do not fill it exactly (or a malformed array) raises
 * ValueError instead of giving other bytes than were counted.
 *
 * Both hold the GIL only to check their arguments and release their
 * buffers: the loops run without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    Py_ssize_t width;     /* 0: a JSON array; else the matrix's row width */
    const char *at;       /* the next text (the array's), or the matrix */
    const char *stop;     /* the buffer's end */
} column_t;

/* What went wrong in the join, for the error raised once the GIL is back. */
typedef enum { JOIN_OK, JOIN_ARRAY, JOIN_OVERFLOW, JOIN_SHORT } join_result;

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The high bit of each zero byte of v set; a bit above the lowest may be set
 * wrongly (a borrow), the lowest is always right. */
static inline uint64_t
zero_bytes(uint64_t v)
{
    return (v - ONES) & ~v & HIGHS;
}

/* Where a text of a JSON array ends: its first comma, bracket or NUL. */
static inline int
is_stop(char ch)
{
    return ch == ',' || ch == ']' || ch == '\0';
}

/* Copy the text at *at to *w, up to its first comma, bracket or NUL (which
 * the buffer's closing bracket guarantees), and move both past it: eight bytes
 * at a time while the input and output have eight left (on a little-endian
 * machine), else one at a time. The eight-byte copy writes past the text;
 * what follows overwrites it. */
static inline join_result
copy_text(const char **at, const char *stop, char **w, char *limit)
{
    const char *p = *at;
    char *o = *w;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (stop - p >= 8 && limit - o >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        memcpy(o, &x, 8);
        uint64_t found = zero_bytes(x ^ (ONES * ',')) | zero_bytes(x ^ (ONES * ']'))
                         | zero_bytes(x);
        if (found) {
            int k = __builtin_ctzll(found) >> 3;
            *at = p + k;
            *w = o + k;
            return JOIN_OK;
        }
        p += 8;
        o += 8;
    }
#endif
    while (!is_stop(*p)) {
        if (o == limit)
            return JOIN_OVERFLOW;
        *o++ = *p++;
    }
    *at = p;
    *w = o;
    return JOIN_OK;
}

static join_result
join_rows(column_t *cols, Py_ssize_t ncols, Py_ssize_t rows, char *out, Py_ssize_t size,
          char sep, char end)
{
    char *w = out;
    char *const limit = out + size;
    for (Py_ssize_t i = 0; i < rows; i++) {
        for (Py_ssize_t j = 0; j < ncols; j++) {
            column_t *c = &cols[j];
            if (c->width == 0) {
                join_result got = copy_text(&c->at, c->stop, &w, limit);
                if (got != JOIN_OK)
                    return got;
                while (*c->at == '\0')  /* a shorter text written over one */
                    c->at++;
                if (*c->at != (i + 1 < rows ? ',' : ']'))
                    return JOIN_ARRAY;
                c->at++;
            } else {
                const char *text = c->at + i * c->width;
                const char *nul = memchr(text, '\0', (size_t)c->width);
                Py_ssize_t len = nul ? nul - text : c->width;
                if (limit - w < len)
                    return JOIN_OVERFLOW;
                memcpy(w, text, (size_t)len);
                w += len;
            }
            if (w == limit)
                return JOIN_OVERFLOW;
            *w++ = (j + 1 < ncols) ? sep : end;
        }
    }
    return w == limit ? JOIN_OK : JOIN_SHORT;
}

static PyObject *
join(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *columns;
    Py_ssize_t rows, size;
    char sep, end;
    if (!PyArg_ParseTuple(args, "O!nncc:join", &PyList_Type, &columns, &rows, &size, &sep,
                          &end))
        return NULL;
    Py_ssize_t ncols = PyList_GET_SIZE(columns);
    if (ncols == 0 || rows < 0 || size < 0) {
        PyErr_SetString(PyExc_ValueError, "join needs columns, rows >= 0 and size >= 0");
        return NULL;
    }
    column_t *cols = PyMem_Calloc((size_t)ncols, sizeof(column_t));
    if (cols == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t held = 0;  /* buffers got, released at the end */
    for (Py_ssize_t j = 0; j < ncols; j++) {
        column_t *c = &cols[j];
        PyObject *buffer;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(columns, j), "On:join column", &buffer,
                              &c->width))
            goto done;
        if (PyObject_GetBuffer(buffer, &c->view, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        held = j + 1;
        c->at = c->view.buf;
        c->stop = (const char *)c->view.buf + c->view.len;
        if (c->width < 0 || (c->width > 0 && c->view.len != rows * c->width)) {
            PyErr_Format(PyExc_ValueError, "column %zd: %zd bytes is not %zd rows of %zd", j,
                         c->view.len, rows, c->width);
            goto done;
        }
        if (c->width == 0) {
            if (c->view.len < 2 || c->at[0] != '[' || c->stop[-1] != ']') {
                PyErr_Format(PyExc_ValueError, "column %zd: not a JSON array", j);
                goto done;
            }
            c->at++;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL)
        goto done;
    join_result got;
    Py_BEGIN_ALLOW_THREADS
    got = join_rows(cols, ncols, rows, PyBytes_AS_STRING(result), size, sep, end);
    Py_END_ALLOW_THREADS
    if (got != JOIN_OK) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError,
                        got == JOIN_ARRAY ? "a column's array does not hold one text per row"
                        : got == JOIN_OVERFLOW ? "the lines are longer than counted"
                                               : "the lines are shorter than counted");
    }
done:
    for (Py_ssize_t j = 0; j < held; j++)
        PyBuffer_Release(&cols[j].view);
    PyMem_Free(cols);
    return result;
}

/* A byte that makes a CSV field need quotes anywhere in it... */
static int
is_special(unsigned char c)
{
    return c == ',' || c == '"' || c == '\r' || c == '\n';
}

/* ...or at its start or end (what Python's str.strip removes, among ASCII). */
static int
is_edge(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* What scan finds; not usable: a byte that is not ASCII, or a NUL inside a text. */
typedef struct {
    Py_ssize_t total;
    int plain, empty, usable;
} scan_result;

static scan_result
scan_rows(const unsigned char *base, Py_ssize_t rows, Py_ssize_t width)
{
    scan_result r = {0, 1, 0, 1};
    for (Py_ssize_t i = 0; i < rows; i++) {
        const unsigned char *t = base + i * width;
        Py_ssize_t len = 0;
        while (len < width && t[len] != 0) {
            unsigned char c = t[len];
            if (c >= 0x80) {
                r.usable = 0;
                return r;
            }
            if (is_special(c))
                r.plain = 0;
            len++;
        }
        for (Py_ssize_t k = len; k < width; k++) {
            if (t[k] != 0) {  /* a NUL inside the value */
                r.usable = 0;
                return r;
            }
        }
        if (len == 0)
            r.empty = 1;
        else if (is_edge(t[0]) || is_edge(t[len - 1]))
            r.plain = 0;
        r.total += len;
    }
    return r;
}

static PyObject *
scan(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t rows, width;
    if (!PyArg_ParseTuple(args, "y*nn:scan", &view, &rows, &width))
        return NULL;
    if (width <= 0 || rows < 0 || view.len != rows * width) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan needs rows of width bytes, width > 0");
        return NULL;
    }
    scan_result r;
    Py_BEGIN_ALLOW_THREADS
    r = scan_rows(view.buf, rows, width);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (!r.usable)
        Py_RETURN_NONE;
    return Py_BuildValue("(nOO)", r.total, r.plain ? Py_True : Py_False,
                         r.empty ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buffer, rows, width) -> (total, plain, empty) | None: the texts of a "
     "NUL-padded byte matrix: their total length, whether none needs CSV quoting, "
     "whether one is empty; None if a byte is not ASCII or a NUL is inside a text."},
    {"join", join, METH_VARARGS,
     "join(columns, rows, size, sep, end) -> bytes: the lines of the columns' texts "
     "(see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_csvjoin",
    "Lines of table text joined from column texts (layouts.views._csvblock).", -1, methods,
};

PyMODINIT_FUNC
PyInit__csvjoin(void)
{
    return PyModule_Create(&module);
}
