/*
 * rdkv's shim over libfabric (feature `ofi`).
 *
 * Why C: most of libfabric's API (fi_domain, fi_endpoint, fi_mr_reg,
 * fi_read, fi_cq_read, fi_av_insert, ...) is static inline functions that
 * call through the ops tables of the objects; they exist only in the
 * headers. This file is compiled against the system headers, so the struct
 * layouts are the installed library's, and the Rust side sees a dozen
 * functions over plain C types and opaque handles.
 *
 * Why dlopen: the library's few exported functions (fi_getinfo,
 * fi_freeinfo, fi_fabric, fi_strerror, fi_version) are looked up at run
 * time, so a binary built with the feature still starts (and says why
 * libfabric is off) where libfabric.so.1 is not installed. Nothing here
 * links against libfabric.
 *
 * Threading: a client's rdkv_ofi_ep is used by one thread at a time (the
 * Rust side holds a lock around every call on it). A server's is opened
 * FI_THREAD_SAFE: its progress thread waits in rdkv_ofi_cq_sread while
 * other threads register and close memory.
 *
 * Waiting: the completion queue is opened with a wait object where the
 * provider has one (FI_WAIT_UNSPEC), so a thread can sleep in
 * fi_cq_sread until the provider sees activity (tcp;ofi_rxm: its sockets'
 * epoll set), progress included, instead of polling.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* The API version rdkv is written against (Debian 12 ships 1.17). */
#define RDKV_OFI_API FI_VERSION(1, 14)

/* MR modes rdkv implements: local registration of its bounce buffer
 * (FI_MR_LOCAL), virtual or offset addressing (FI_MR_VIRT_ADDR),
 * provider keys (FI_MR_PROV_KEY), allocated memory (FI_MR_ALLOCATED) and
 * per-endpoint binding (FI_MR_ENDPOINT). */
#define RDKV_OFI_MR_MODES                                                     \
    (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED |       \
     FI_MR_ENDPOINT)

struct rdkv_ofi_lib {
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t,
                   const struct fi_info *, struct fi_info **);
    void (*freeinfo)(struct fi_info *);
    struct fi_info *(*dupinfo)(const struct fi_info *);
    int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
    const char *(*strerror)(int);
    uint32_t (*version)(void);
};

static struct rdkv_ofi_lib lib;
static int lib_loaded;

struct rdkv_ofi_ep {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    int waitable;
    char provider[64];
};

static void set_err(char *err, size_t errlen, const char *what, int rc) {
    if (err == NULL || errlen == 0)
        return;
    if (rc != 0 && lib.strerror != NULL)
        snprintf(err, errlen, "%s: %s (%d)", what, lib.strerror(-rc), rc);
    else
        snprintf(err, errlen, "%s", what);
}

int rdkv_ofi_load(const char *path, char *err, size_t errlen) {
    void *handle;
    if (lib_loaded)
        return 0;
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        snprintf(err, errlen, "%s not loadable: %s", path,
                 why ? why : "unknown");
        return -1;
    }
    lib.getinfo = (void *)dlsym(handle, "fi_getinfo");
    lib.freeinfo = (void *)dlsym(handle, "fi_freeinfo");
    lib.dupinfo = (void *)dlsym(handle, "fi_dupinfo");
    lib.fabric = (void *)dlsym(handle, "fi_fabric");
    lib.strerror = (void *)dlsym(handle, "fi_strerror");
    lib.version = (void *)dlsym(handle, "fi_version");
    if (!lib.getinfo || !lib.freeinfo || !lib.dupinfo || !lib.fabric ||
        !lib.strerror || !lib.version) {
        snprintf(err, errlen, "%s lacks a required symbol", path);
        dlclose(handle);
        memset(&lib, 0, sizeof(lib));
        return -1;
    }
    if (FI_MAJOR(lib.version()) != 1 ||
        FI_MINOR(lib.version()) < FI_MINOR(RDKV_OFI_API)) {
        snprintf(err, errlen, "libfabric %u.%u is older than 1.%u",
                 FI_MAJOR(lib.version()), FI_MINOR(lib.version()),
                 FI_MINOR(RDKV_OFI_API));
        dlclose(handle);
        memset(&lib, 0, sizeof(lib));
        return -1;
    }
    /* The handle stays open for the life of the process. */
    lib_loaded = 1;
    return 0;
}

uint32_t rdkv_ofi_version(void) { return lib_loaded ? lib.version() : 0; }

const char *rdkv_ofi_strerror(int errnum) {
    return lib_loaded ? lib.strerror(errnum) : "libfabric not loaded";
}

void rdkv_ofi_close(struct rdkv_ofi_ep *e) {
    if (e == NULL)
        return;
    /* Endpoint first: closing it ends its transfers, so no completion can
     * land in a buffer after this returns. */
    if (e->ep)
        fi_close(&e->ep->fid);
    if (e->av)
        fi_close(&e->av->fid);
    if (e->cq)
        fi_close(&e->cq->fid);
    if (e->domain)
        fi_close(&e->domain->fid);
    if (e->fabric)
        fi_close(&e->fabric->fid);
    if (e->info)
        lib.freeinfo(e->info);
    free(e);
}

static struct fi_info *rdm_hints(const char *prov, int thread_safe) {
    struct fi_info *hints = lib.dupinfo(NULL);
    if (hints == NULL)
        return NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
    /* No FI_CONTEXT mode: operation contexts are plain tags, never
     * memory the provider may write. */
    hints->mode = 0;
    hints->domain_attr->mr_mode = RDKV_OFI_MR_MODES;
    hints->domain_attr->threading = thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
    hints->addr_format = FI_FORMAT_UNSPEC;
    if (prov != NULL) {
        hints->fabric_attr->prov_name = strdup(prov);
        if (hints->fabric_attr->prov_name == NULL) {
            lib.freeinfo(hints);
            return NULL;
        }
    }
    return hints;
}

static int open_objects(struct rdkv_ofi_ep *e, char *err, size_t errlen) {
    struct fi_cq_attr cq_attr;
    struct fi_av_attr av_attr;
    int rc;

    rc = lib.fabric(e->info->fabric_attr, &e->fabric, NULL);
    if (rc) { set_err(err, errlen, "fi_fabric", rc); return rc; }
    rc = fi_domain(e->fabric, e->info, &e->domain, NULL);
    if (rc) { set_err(err, errlen, "fi_domain", rc); return rc; }
    memset(&cq_attr, 0, sizeof(cq_attr));
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    cq_attr.size = e->info->tx_attr->size;
    rc = fi_cq_open(e->domain, &cq_attr, &e->cq, NULL);
    e->waitable = rc == 0;
    if (rc) {
        /* No wait object here: the queue is polled. */
        cq_attr.wait_obj = FI_WAIT_NONE;
        rc = fi_cq_open(e->domain, &cq_attr, &e->cq, NULL);
    }
    if (rc) { set_err(err, errlen, "fi_cq_open", rc); return rc; }
    memset(&av_attr, 0, sizeof(av_attr));
    av_attr.type = FI_AV_TABLE;
    rc = fi_av_open(e->domain, &av_attr, &e->av, NULL);
    if (rc) { set_err(err, errlen, "fi_av_open", rc); return rc; }
    rc = fi_endpoint(e->domain, e->info, &e->ep, NULL);
    if (rc) { set_err(err, errlen, "fi_endpoint", rc); return rc; }
    rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV);
    if (rc) { set_err(err, errlen, "fi_ep_bind(cq)", rc); return rc; }
    rc = fi_ep_bind(e->ep, &e->av->fid, 0);
    if (rc) { set_err(err, errlen, "fi_ep_bind(av)", rc); return rc; }
    rc = fi_enable(e->ep);
    if (rc) { set_err(err, errlen, "fi_enable", rc); return rc; }
    return 0;
}

/* Opens an RDM endpoint of provider `prov` (NULL: the first RMA-capable
 * one), bound to address `node` when given (a server binds where it
 * listens, a client where its route to the server leaves), FI_THREAD_SAFE
 * when `thread_safe`, else FI_THREAD_DOMAIN. */
int rdkv_ofi_open(const char *prov, const char *node, int thread_safe,
                  struct rdkv_ofi_ep **out, char *err, size_t errlen) {
    struct fi_info *hints;
    struct rdkv_ofi_ep *e;
    int rc;

    *out = NULL;
    if (!lib_loaded) {
        set_err(err, errlen, "libfabric not loaded", 0);
        return -FI_ENOSYS;
    }
    hints = rdm_hints(prov, thread_safe);
    if (hints == NULL) {
        set_err(err, errlen, "fi_dupinfo failed", 0);
        return -FI_ENOMEM;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        lib.freeinfo(hints);
        set_err(err, errlen, "out of memory", 0);
        return -FI_ENOMEM;
    }
    rc = lib.getinfo(RDKV_OFI_API, node, node ? "0" : NULL,
                     node ? FI_SOURCE : 0, hints, &e->info);
    lib.freeinfo(hints);
    if (rc) {
        set_err(err, errlen, "fi_getinfo", rc);
        free(e);
        return rc;
    }
    snprintf(e->provider, sizeof(e->provider), "%s",
             e->info->fabric_attr->prov_name ? e->info->fabric_attr->prov_name
                                             : "?");
    rc = open_objects(e, err, errlen);
    if (rc) {
        rdkv_ofi_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* Ends the endpoint's transfers (closing it) but keeps the domain, so
 * registrations can still be closed before it: after this returns no
 * transfer of this endpoint writes memory any more. */
void rdkv_ofi_close_transfers(struct rdkv_ofi_ep *e) {
    if (e->ep) {
        fi_close(&e->ep->fid);
        e->ep = NULL;
    }
}

const char *rdkv_ofi_provider(const struct rdkv_ofi_ep *e) { return e->provider; }

uint64_t rdkv_ofi_mr_mode(const struct rdkv_ofi_ep *e) {
    return (uint64_t)e->info->domain_attr->mr_mode;
}

size_t rdkv_ofi_mr_key_size(const struct rdkv_ofi_ep *e) {
    return e->info->domain_attr->mr_key_size;
}

size_t rdkv_ofi_tx_size(const struct rdkv_ofi_ep *e) {
    return e->info->tx_attr->size;
}

int rdkv_ofi_waitable(const struct rdkv_ofi_ep *e) { return e->waitable; }

int rdkv_ofi_name(struct rdkv_ofi_ep *e, void *buf, size_t *len) {
    return fi_getname(&e->ep->fid, buf, len);
}

/* Registers [buf, buf+len) with `access`; `requested_key` is used unless
 * the provider picks keys (FI_MR_PROV_KEY). With FI_MR_ENDPOINT the
 * registration is bound to this endpoint and enabled. */
int rdkv_ofi_mr_reg(struct rdkv_ofi_ep *e, const void *buf, size_t len,
                    uint64_t access, uint64_t requested_key,
                    struct fid_mr **mr, uint64_t *key, void **desc) {
    int rc;
    *mr = NULL;
    rc = fi_mr_reg(e->domain, buf, len, access, 0, requested_key, 0, mr, NULL);
    if (rc)
        return rc;
    if (e->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        rc = fi_mr_bind(*mr, &e->ep->fid, 0);
        if (rc == 0)
            rc = fi_mr_enable(*mr);
        if (rc) {
            fi_close(&(*mr)->fid);
            *mr = NULL;
            return rc;
        }
    }
    *key = fi_mr_key(*mr);
    *desc = fi_mr_desc(*mr);
    return 0;
}

int rdkv_ofi_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

int rdkv_ofi_av_insert(struct rdkv_ofi_ep *e, const void *addr,
                       uint64_t *fi_addr) {
    fi_addr_t out = FI_ADDR_NOTAVAIL;
    int n = fi_av_insert(e->av, addr, 1, &out, 0, NULL);
    if (n != 1)
        return n < 0 ? n : -FI_EINVAL;
    *fi_addr = out;
    return 0;
}

ssize_t rdkv_ofi_read(struct rdkv_ofi_ep *e, void *buf, size_t len,
                      void *desc, uint64_t src, uint64_t addr, uint64_t key,
                      uint64_t tag) {
    return fi_read(e->ep, buf, len, desc, (fi_addr_t)src, addr, key,
                   (void *)(uintptr_t)tag);
}

/* Up to `n` completions' tags into `tags`: their count, -FI_EAGAIN when
 * there is none, -FI_EAVAIL when an error completion is next. Also
 * drives the provider's progress (manual progress providers such as
 * tcp;ofi_rxm serve remote reads of this endpoint's memory only here). */
ssize_t rdkv_ofi_cq_read(struct rdkv_ofi_ep *e, uint64_t *tags, size_t n) {
    struct fi_cq_entry entries[64];
    ssize_t got;
    size_t i;
    if (n > 64)
        n = 64;
    got = fi_cq_read(e->cq, entries, n);
    for (i = 0; got > 0 && i < (size_t)got; i++)
        tags[i] = (uint64_t)(uintptr_t)entries[i].op_context;
    return got;
}

/* Like rdkv_ofi_cq_read, but sleeps up to `timeout_ms` for a completion
 * (on the queue's wait object, driving progress when woken): -FI_EAGAIN
 * when none came, -FI_ECANCELED (or another -FI_E*) when woken by
 * rdkv_ofi_cq_signal. Only on a waitable endpoint. */
ssize_t rdkv_ofi_cq_sread(struct rdkv_ofi_ep *e, uint64_t *tags, size_t n,
                          int timeout_ms) {
    struct fi_cq_entry entries[64];
    ssize_t got;
    size_t i;
    if (n > 64)
        n = 64;
    got = fi_cq_sread(e->cq, entries, n, NULL, timeout_ms);
    for (i = 0; got > 0 && i < (size_t)got; i++)
        tags[i] = (uint64_t)(uintptr_t)entries[i].op_context;
    return got;
}

/* Wakes a thread sleeping in rdkv_ofi_cq_sread (a server stopping). */
int rdkv_ofi_cq_signal(struct rdkv_ofi_ep *e) { return fi_cq_signal(e->cq); }

/* The next error completion: its tag and error number (positive). */
ssize_t rdkv_ofi_cq_readerr(struct rdkv_ofi_ep *e, uint64_t *tag, int *errnum) {
    struct fi_cq_err_entry entry;
    ssize_t rc;
    memset(&entry, 0, sizeof(entry));
    rc = fi_cq_readerr(e->cq, &entry, 0);
    if (rc == 1) {
        *tag = (uint64_t)(uintptr_t)entry.op_context;
        *errnum = entry.err;
    }
    return rc;
}
