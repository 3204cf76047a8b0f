/* Backend modules: the backends built as shared objects of their own
 * (libcten-cuda.so) because they link libraries a machine may lack (the CUDA
 * runtime, cuBLAS, cuDNN). libcten.so itself links none of them and loads
 * each module at init when it can run, so one installed library serves
 * machines with and without a GPU, and says why a module did not load.
 *
 * Where a module is looked for, first hit wins:
 *   1. the file the environment names (CT_CUDA_MODULE=/path; "none" or "0"
 *      turns the module off);
 *   2. next to the libcten.so this code runs in (found with dladdr): in its
 *      cten/ subdirectory, where an install puts modules, then beside it,
 *      where the build tree has them. This keeps a relocated or staged
 *      install, and the build tree, from picking another install's module;
 *   3. the install's module directory (CTI_MODULE_DIR, $libdir/cten).
 * A module is loaded only when the driver library it needs to reach a
 * device is present (CUDA: libcuda.so.1): dlopen of the driver costs
 * little, while loading the module maps the runtime, cuBLAS and cuDNN
 * (about 80 ms), which a machine with no driver cannot use.
 *
 * The static library never loads modules: a module links libcten.so, and
 * loading it into a program that carries its own copy of cten would give
 * the process two kernel tables. The build compiles this file with
 * CTI_LOAD_MODULES for the shared library only. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cten_backends.h"
#include "dispatch_impl.h"

typedef struct module_info {
    const char *name;      /* "cuda": the backend value is cti_backend_<name> */
    ct_device_type device; /* the device type it serves */
    const char *file;      /* "libcten-cuda.so" */
    const char *env;       /* "CT_CUDA_MODULE" */
    const char *driver;    /* "libcuda.so.1" */
} module_info;

#define INFO_(b, dev, file, env, driver) {#b, dev, file, env, driver},
static const module_info modules[] = {CTI_MODULE_LIST(INFO_){NULL, CT_DEVICE_CPU, NULL, NULL, NULL}};
#undef INFO_
enum { NUM_MODULES = sizeof modules / sizeof modules[0] - 1 };

typedef struct module_state {
    void *handle, *driver;
    const cti_backend *backend;
    char path[4096];
    char why[16384]; /* room for three paths and dlerror's text */
} module_state;

/* Written by init, read-only after. */
static module_state states[NUM_MODULES + 1];

static module_state *state_of(ct_device_type device) {
    for (int k = 0; k < NUM_MODULES; k++)
        if (modules[k].device == device) return &states[k];
    return NULL;
}

const char *cti_module_missing(ct_device_type device) {
    cti_init();
    module_state *st = state_of(device);
    return st && !st->backend ? st->why : NULL;
}

const char *cti_module_path(ct_device_type device) {
    cti_init();
    module_state *st = state_of(device);
    return st && st->backend ? st->path : NULL;
}

void *cti_module_symbol(ct_device_type device, const char *name) {
    cti_init();
    module_state *st = state_of(device);
    return st && st->handle && name ? dlsym(st->handle, name) : NULL;
}

#ifdef CTI_LOAD_MODULES

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* Finds m's file; false with st->why saying where it looked. */
static bool find_module(const module_info *m, module_state *st) {
    const char *env = secure_getenv(m->env);
    if (env && *env) {
        if (!strcmp(env, "none") || !strcmp(env, "0")) {
            snprintf(st->why, sizeof st->why, "turned off (%s=%s)", m->env, env);
            return false;
        }
        if (!exists(env)) {
            snprintf(st->why, sizeof st->why, "%s=%s: %s", m->env, env, strerror(errno));
            return false;
        }
        snprintf(st->path, sizeof st->path, "%s", env);
        return true;
    }
    char tried[3][sizeof st->path];
    int n = 0;
    Dl_info self;
    if (dladdr((void *)&find_module, &self) && self.dli_fname && strchr(self.dli_fname, '/')) {
        int dir = (int)(strrchr(self.dli_fname, '/') - self.dli_fname);
        snprintf(tried[n++], sizeof tried[0], "%.*s/cten/%s", dir, self.dli_fname, m->file);
        snprintf(tried[n++], sizeof tried[0], "%.*s/%s", dir, self.dli_fname, m->file);
    }
    snprintf(tried[n++], sizeof tried[0], "%s/%s", CTI_MODULE_DIR, m->file);
    for (int k = 0; k < n; k++)
        if (exists(tried[k])) {
            /* dladdr gives the path libcten.so was found by ("bin/../lib/..."). */
            if (!realpath(tried[k], st->path)) memcpy(st->path, tried[k], sizeof st->path);
            return true;
        }
    int pos = snprintf(st->why, sizeof st->why, "no module file (looked for");
    for (int k = 0; k < n && pos < (int)sizeof st->why; k++)
        pos += snprintf(st->why + pos, sizeof st->why - (size_t)pos, "%s %s", k ? "," : "",
                        tried[k]);
    if (pos < (int)sizeof st->why)
        snprintf(st->why + pos, sizeof st->why - (size_t)pos, "; %s names another)", m->env);
    return false;
}

static bool same_abi(const cti_abi *a, const cti_abi *b) {
    return !strcmp(a->version, b->version) && a->ops == b->ops && a->dtypes == b->dtypes &&
           a->device_types == b->device_types && a->max_dims == b->max_dims &&
           a->params_max == b->params_max && a->tensor == b->tensor &&
           a->storage == b->storage && a->call == b->call && a->backend == b->backend &&
           a->allocator == b->allocator;
}

static bool load(const module_info *m, module_state *st) {
    if (!find_module(m, st)) return false;
    void *driver = dlopen(m->driver, RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
        snprintf(st->why, sizeof st->why, "no driver (%s)", dlerror());
        return false;
    }
    /* RTLD_NOW: a module that cannot resolve everything (a library of the
     * wrong version, another cten's internals) fails here, with dlopen's
     * message, instead of at its first call. */
    void *h = dlopen(st->path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(st->why, sizeof st->why, "%s", dlerror());
        dlclose(driver);
        return false;
    }
    char sym[64];
    snprintf(sym, sizeof sym, "cti_backend_%s", m->name);
    const cti_abi *abi = dlsym(h, "cti_module_abi");
    const cti_backend *b = abi ? dlsym(h, sym) : NULL;
    const cti_abi here = CTI_ABI_HERE;
    if (!abi || !b) {
        snprintf(st->why, sizeof st->why, "%s is not a cten backend module (it lacks %s)",
                 st->path, abi ? sym : "cti_module_abi");
        goto refused;
    }
    if (!same_abi(abi, &here)) {
        snprintf(st->why, sizeof st->why,
                 "%s was built for another cten (cten %s: %d ops, %zu-byte tensors, %zu-byte "
                 "backend struct; this library: cten %s: %d ops, %zu, %zu)",
                 st->path, abi->version, abi->ops, abi->tensor, abi->backend, here.version,
                 here.ops, here.tensor, here.backend);
        goto refused;
    }
    if (b->device != m->device) {
        snprintf(st->why, sizeof st->why, "%s serves device type %d, expected %d", st->path,
                 (int)b->device, (int)m->device);
        goto refused;
    }
    /* The driver stays open: the module's runtime opens it again when a
     * device is first asked about, and unmapping it between would be waste. */
    st->driver = driver;
    st->handle = h;
    st->backend = b;
    return true;
refused:
    dlclose(h);
    dlclose(driver);
    return false;
}

int cti_modules_load(const cti_backend **out, int max) {
    int n = 0;
    for (int k = 0; k < NUM_MODULES; k++)
        if (n < max && load(&modules[k], &states[k])) out[n++] = states[k].backend;
    return n;
}

#else

int cti_modules_load(const cti_backend **out, int max) {
    (void)out;
    (void)max;
    for (int k = 0; k < NUM_MODULES; k++)
        snprintf(states[k].why, sizeof states[k].why,
                 "this program links cten statically, and the %s backend is a module (%s) "
                 "that only the shared library libcten.so loads",
                 modules[k].name, modules[k].file);
    return 0;
}

#endif
