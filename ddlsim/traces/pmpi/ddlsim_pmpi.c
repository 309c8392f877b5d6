/* ddlsim's PMPI recorder: logs the MPI calls of a C/C++ program as ddlsim MPI call logs
 * (docs/traces.md, "MPI call logs"; the reader is ddlsim/traces/mpilog.py).
 *
 * Build and use (Open MPI or MPICH; the program must link libmpi dynamically):
 *   mpicc -shared -fPIC -O2 -o libddlsim_pmpi.so ddlsim_pmpi.c
 *   DDLSIM_MPILOG_DIR=logs mpirun -n 4 -x LD_PRELOAD=$PWD/libddlsim_pmpi.so -x DDLSIM_MPILOG_DIR ./prog
 * Each rank writes DIR/mpilog.RANK.jsonl at MPI_Finalize. Every wrapper times the PMPI call
 * with PMPI_Wtime and records its size in ddlsim's (nccl-tests) convention. Calls not
 * wrapped here pass through unlogged. */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *out = NULL;
static size_t out_len = 0, out_cap = 0;
static int me = -1;
static long long next_req = 0;

static void emit(const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    if (out_len + n + 1 > out_cap) {
        out_cap = (out_cap + n + 1) * 2;
        out = realloc(out, out_cap);
        if (!out) { fprintf(stderr, "ddlsim_pmpi: out of memory\n"); abort(); }
    }
    memcpy(out + out_len, line, n);
    out_len += n;
}

/* ---- communicators: names and members (global ranks) */
#define MAX_COMMS 1024
static struct { MPI_Comm comm; char name[96]; int made; } comms[MAX_COMMS];
static int ncomms = 0;

static int world_rank(MPI_Comm comm, int r) {
    MPI_Group g, w;
    int out_r = r;
    if (comm == MPI_COMM_WORLD || r < 0) return r;
    PMPI_Comm_group(comm, &g);
    PMPI_Comm_group(MPI_COMM_WORLD, &w);
    PMPI_Group_translate_ranks(g, 1, &r, w, &out_r);
    PMPI_Group_free(&g);
    PMPI_Group_free(&w);
    return out_r;
}

static int find(MPI_Comm comm) {
    for (int i = 0; i < ncomms; i++) if (comms[i].comm == comm) return i;
    return -1;
}

static void declare(MPI_Comm comm, const char *name) {
    int n, i;
    if (ncomms >= MAX_COMMS) { fprintf(stderr, "ddlsim_pmpi: over %d communicators\n", MAX_COMMS); abort(); }
    comms[ncomms].comm = comm;
    snprintf(comms[ncomms].name, sizeof comms[ncomms].name, "%s", name);
    comms[ncomms].made = 0;
    ncomms++;
    PMPI_Comm_size(comm, &n);
    emit("{\"comm\": \"%s\", \"ranks\": [", name);
    for (i = 0; i < n; i++) emit(i ? ", %d" : "%d", world_rank(comm, i));
    emit("]}\n");
}

static const char *name_of(MPI_Comm comm) {
    int i = find(comm);
    if (i < 0) {
        char name[96];
        snprintf(name, sizeof name, "comm%d", ncomms);
        declare(comm, name);
        i = ncomms - 1;
    }
    return comms[i].name;
}

static long long nbytes(int count, MPI_Datatype t) {
    int s = 0;
    PMPI_Type_size(t, &s);
    return (long long)count * s;
}

static int size_of(MPI_Comm comm) { int n; PMPI_Comm_size(comm, &n); return n; }

static void call(const char *op, double t0, double t1, long long bytes, MPI_Comm comm,
                 const char *extra) {
    emit("{\"call\": \"%s\", \"t0\": %.9f, \"t1\": %.9f, \"bytes\": %lld, \"comm\": \"%s\"%s}\n",
         op, t0, t1, bytes, name_of(comm), extra);
}

/* non-blocking: the request's id, kept beside the handle until a wait completes it */
#define MAX_REQS 65536
static struct { MPI_Request req; long long id; } reqs[MAX_REQS];
static int nreqs = 0;

static long long track(MPI_Request req) {
    long long id = next_req++;
    if (nreqs < MAX_REQS) { reqs[nreqs].req = req; reqs[nreqs].id = id; nreqs++; }
    return id;
}

static long long untrack(MPI_Request req) {
    for (int i = 0; i < nreqs; i++)
        if (reqs[i].req == req) { long long id = reqs[i].id; reqs[i] = reqs[--nreqs]; return id; }
    return -1;
}

/* ---- set-up and tear-down */
static void start(void) {
    int n;
    PMPI_Comm_rank(MPI_COMM_WORLD, &me);
    PMPI_Comm_size(MPI_COMM_WORLD, &n);
    emit("{\"ddlsim_mpilog\": 1, \"rank\": %d, \"size\": %d}\n", me, n);
    comms[0].comm = MPI_COMM_WORLD;
    snprintf(comms[0].name, sizeof comms[0].name, "world");
    ncomms = 1;
}

int MPI_Init(int *argc, char ***argv) { int r = PMPI_Init(argc, argv); start(); return r; }

int MPI_Init_thread(int *argc, char ***argv, int req, int *prov) {
    int r = PMPI_Init_thread(argc, argv, req, prov);
    start();
    return r;
}

int MPI_Finalize(void) {
    const char *dir = getenv("DDLSIM_MPILOG_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/mpilog.%d.jsonl", dir && *dir ? dir : ".", me);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); }
    else { fwrite(out, 1, out_len, f); fclose(f); }
    free(out);
    return PMPI_Finalize();
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm) {
    int r = PMPI_Comm_split(comm, color, key, newcomm);
    if (*newcomm != MPI_COMM_NULL) {
        int i = find(comm);
        char name[96];
        const char *parent = name_of(comm);
        i = find(comm);
        snprintf(name, sizeof name, "%s.%d", parent, ++comms[i].made);
        declare(*newcomm, name);
    }
    return r;
}

/* ---- collectives */
#define TIMED(expr) double t0 = PMPI_Wtime(); int r = (expr); double t1 = PMPI_Wtime()

int MPI_Allreduce(const void *s, void *d, int c, MPI_Datatype t, MPI_Op o, MPI_Comm comm) {
    TIMED(PMPI_Allreduce(s, d, c, t, o, comm));
    call("allreduce", t0, t1, nbytes(c, t), comm, "");
    return r;
}

int MPI_Iallreduce(const void *s, void *d, int c, MPI_Datatype t, MPI_Op o, MPI_Comm comm,
                   MPI_Request *q) {
    char extra[64];
    TIMED(PMPI_Iallreduce(s, d, c, t, o, comm, q));
    snprintf(extra, sizeof extra, ", \"nb\": true, \"req\": %lld", track(*q));
    call("allreduce", t0, t1, nbytes(c, t), comm, extra);
    return r;
}

int MPI_Reduce(const void *s, void *d, int c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm comm) {
    char extra[64];
    TIMED(PMPI_Reduce(s, d, c, t, o, root, comm));
    snprintf(extra, sizeof extra, ", \"root\": %d", world_rank(comm, root));
    call("reduce", t0, t1, nbytes(c, t), comm, extra);
    return r;
}

int MPI_Bcast(void *b, int c, MPI_Datatype t, int root, MPI_Comm comm) {
    char extra[64];
    TIMED(PMPI_Bcast(b, c, t, root, comm));
    snprintf(extra, sizeof extra, ", \"root\": %d", world_rank(comm, root));
    call("bcast", t0, t1, nbytes(c, t), comm, extra);
    return r;
}

int MPI_Allgather(const void *s, int sc, MPI_Datatype st, void *d, int rc, MPI_Datatype rt,
                  MPI_Comm comm) {
    TIMED(PMPI_Allgather(s, sc, st, d, rc, rt, comm));
    call("allgather", t0, t1, size_of(comm) * nbytes(rc, rt), comm, "");
    return r;
}

int MPI_Reduce_scatter_block(const void *s, void *d, int rc, MPI_Datatype t, MPI_Op o,
                             MPI_Comm comm) {
    TIMED(PMPI_Reduce_scatter_block(s, d, rc, t, o, comm));
    call("reduce_scatter", t0, t1, size_of(comm) * nbytes(rc, t), comm, "");
    return r;
}

int MPI_Alltoall(const void *s, int sc, MPI_Datatype st, void *d, int rc, MPI_Datatype rt,
                 MPI_Comm comm) {
    TIMED(PMPI_Alltoall(s, sc, st, d, rc, rt, comm));
    long long b = s == MPI_IN_PLACE ? nbytes(rc, rt) : nbytes(sc, st);
    call("alltoall", t0, t1, size_of(comm) * b, comm, "");
    return r;
}

int MPI_Barrier(MPI_Comm comm) {
    TIMED(PMPI_Barrier(comm));
    call("barrier", t0, t1, 0, comm, "");
    return r;
}

/* ---- point to point */
int MPI_Send(const void *b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
    char extra[96];
    TIMED(PMPI_Send(b, c, t, dest, tag, comm));
    snprintf(extra, sizeof extra, ", \"peer\": %d, \"tag\": %d", world_rank(comm, dest), tag);
    call("send", t0, t1, nbytes(c, t), comm, extra);
    return r;
}

int MPI_Isend(const void *b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm,
              MPI_Request *q) {
    char extra[128];
    TIMED(PMPI_Isend(b, c, t, dest, tag, comm, q));
    snprintf(extra, sizeof extra, ", \"peer\": %d, \"tag\": %d, \"nb\": true, \"req\": %lld",
             world_rank(comm, dest), tag, track(*q));
    call("send", t0, t1, nbytes(c, t), comm, extra);
    return r;
}

int MPI_Recv(void *b, int c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    MPI_Status local;
    MPI_Status *use = st == MPI_STATUS_IGNORE ? &local : st;
    char extra[96];
    int got = 0;
    TIMED(PMPI_Recv(b, c, t, src, tag, comm, use));
    PMPI_Get_count(use, MPI_BYTE, &got);
    snprintf(extra, sizeof extra, ", \"peer\": %d, \"tag\": %d",
             world_rank(comm, use->MPI_SOURCE), use->MPI_TAG);
    call("recv", t0, t1, got, comm, extra);
    return r;
}

int MPI_Irecv(void *b, int c, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Request *q) {
    char extra[128];
    TIMED(PMPI_Irecv(b, c, t, src, tag, comm, q));
    snprintf(extra, sizeof extra, ", \"peer\": %d, \"tag\": %d, \"nb\": true, \"req\": %lld",
             world_rank(comm, src), tag, track(*q));
    call("recv", t0, t1, nbytes(c, t), comm, extra);
    return r;
}

/* ---- completion */
static void waited(double t0, double t1, int n, const long long *ids) {
    emit("{\"call\": \"wait\", \"t0\": %.9f, \"t1\": %.9f, \"reqs\": [", t0, t1);
    int first = 1;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0) { emit(first ? "%lld" : ", %lld", ids[i]); first = 0; }
    emit("]}\n");
}

int MPI_Wait(MPI_Request *q, MPI_Status *st) {
    long long id = untrack(*q);
    TIMED(PMPI_Wait(q, st));
    waited(t0, t1, 1, &id);
    return r;
}

int MPI_Waitall(int n, MPI_Request q[], MPI_Status st[]) {
    long long *ids = malloc(sizeof(long long) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) ids[i] = untrack(q[i]);
    TIMED(PMPI_Waitall(n, q, st));
    waited(t0, t1, n, ids);
    free(ids);
    return r;
}
