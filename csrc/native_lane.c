/* The native steady-state lane of ripples: one call per repeated host all-reduce.
 *
 * A lane belongs to one group's communicator (a duplicate that only the lane uses). Each
 * call all-reduces a fixed-size agreement record of doubles: six fields (count of members
 * on this plan, plan id and its square, step and its square, 1; all integers below 2^53,
 * so exact) and a slot of SMALL elements. When every member is at the same step of the
 * same plan the data is summed: a call of at most SMALL elements travels in the slot (one
 * all-reduce in all, summed in double and rounded once); a bigger one is all-reduced in
 * place afterwards (non-blocking below BLOCKING_BYTES, else with a blocking MPI_Allreduce
 * in its own call, rl_lane_data, which Python runs inside its data-phase watch). Then it
 * is scaled for an average. A member that posted something else leaves every buffer as
 * it was: the slot is a copy.
 * Waits are bounded: after `deadline_s` the call returns a *_PENDING status and keeps its
 * request, and the next call on the lane continues it (Python decides how long to wait
 * and whom to ask about absent members). Nothing here raises or aborts: every outcome is
 * a status for the Python control plane (ripples/ops/native_lane.py).
 *
 * Compiled against the MPI library mpi4py loaded; the communicator comes from mpi4py
 * (MPI._handleof), so both sides must use the same MPI.
 */
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

enum { RL_OK = 0, RL_RECORD_PENDING = 1, RL_NOT_UNANIMOUS = 2, RL_DATA_PENDING = 3,
       RL_AGREED = 4, RL_MPI_ERROR = -1, RL_BAD_ARGUMENT = -2 };
enum { IDLE = 0, RECORD = 1, DATA = 2, AGREED = 3 };
enum { FIELDS = 6, SMALL = 128, RECORD_LENGTH = FIELDS + SMALL };
#define STEP_MODULUS (1 << 20)
#define BLOCKING_BYTES (64 * 1024)

typedef struct {
    MPI_Comm comm;
    int size;
    int state;
    MPI_Request request;
    MPI_Request record;  /* persistent all-reduce of mine into summed, or MPI_REQUEST_NULL */
    int record_active;   /* started and not seen complete: it must not be freed */
    double mine[RECORD_LENGTH];
    double summed[RECORD_LENGTH];
    int64_t plan, step;
    int64_t steps;  /* completed rounds, equal on every member */
    int mpi_error;  /* the MPI error code of the last RL_MPI_ERROR */
    double phase_start;  /* when the pending record or data phase began (now_s) */
    void *buffer;
    int count, dtype, average;
} rl_lane;

/* A planned call's fixed arguments, kept by Python (a ctypes structure) so that the
 * steady-state call converts two pointers: converting eight arguments through ctypes
 * cost more than the all-reduce of a small tensor. */
typedef struct {
    void *lane;
    int64_t plan;
    int32_t count, dtype, average;
    double first_wait_s;
} rl_call;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Test `request` until it completes or `deadline_s` passes. The phase of the wait goes by
 * the time since the phase began (`since`), not since this call: Python continues a long
 * wait in short calls, and each of them must not spin and yield again (a waiting member
 * then burned a whole core, taking it from the slow peer it waited for). Spin briefly (a
 * shared-memory round trip takes microseconds), then yield the core, then nap up to
 * 200 us (as poll_until in ripples/comm/mpi.py). */
static int wait_bounded(MPI_Request *request, double since, double deadline_s, int *done) {
    double start = now_s();
    long nap_ns = 0;
    for (;;) {
        int rc = MPI_Test(request, done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (*done) return MPI_SUCCESS;
        double now = now_s(), waited = now - since;
        if (now - start >= deadline_s) return MPI_SUCCESS;
        if (waited < 100e-6) continue;
        if (waited < 5e-3) { sched_yield(); continue; }
        nap_ns = nap_ns ? (nap_ns * 2 > 200000 ? 200000 : nap_ns * 2) : 20000;
        struct timespec nap = {0, nap_ns};
        nanosleep(&nap, NULL);
    }
}

/* Every round all-reduces the same buffers on the same communicator: a persistent
 * collective (MPI 4; Open MPI 5 has it while it reports MPI 3.1) builds its schedule
 * once, where MPI_Iallreduce builds one per call. Measured with 1072-byte records,
 * Open MPI 5.0.11, one host: 2.7 against 3.9 us at 2 ranks, 14.4 against 18.6 us at 4
 * ranks on 2 cores. Where the library lacks it, or its set-up fails, rounds use
 * MPI_Iallreduce. */
#if MPI_VERSION >= 4 || (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
#define RL_PERSISTENT 1
#else
#define RL_PERSISTENT 0
#endif

void *rl_lane_new(void *comm_handle, int size) {
    rl_lane *lane = calloc(1, sizeof(rl_lane));
    if (lane == NULL) return NULL;
    lane->comm = *(MPI_Comm *)comm_handle;
    lane->size = size;
    lane->state = IDLE;
    lane->request = MPI_REQUEST_NULL;
    lane->record = MPI_REQUEST_NULL;
#if RL_PERSISTENT
    if (MPI_Allreduce_init(lane->mine, lane->summed, RECORD_LENGTH, MPI_DOUBLE, MPI_SUM,
                           lane->comm, MPI_INFO_NULL, &lane->record) != MPI_SUCCESS)
        lane->record = MPI_REQUEST_NULL;
#endif
    return lane;
}

/* Free a lane. A record round still active keeps its request (MPI forbids freeing an
 * active persistent collective), as a pending non-persistent one always did. */
void rl_lane_free(void *handle) {
    rl_lane *lane = handle;
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized && lane->record != MPI_REQUEST_NULL && !lane->record_active)
        MPI_Request_free(&lane->record);
    free(lane);
}

/* Whether the lane's record rounds run on a persistent collective. */
int rl_lane_persistent(void *handle) { return ((rl_lane *)handle)->record != MPI_REQUEST_NULL; }

int rl_lane_state(void *handle) { return ((rl_lane *)handle)->state; }

int64_t rl_lane_steps(void *handle) { return ((rl_lane *)handle)->steps; }

int rl_lane_mpi_error(void *handle) { return ((rl_lane *)handle)->mpi_error; }

/* An MPI call failed (a member died, the communicator was revoked): the lane is done; the
 * code tells Python which failure it was. */
static int failed(rl_lane *lane, int mpi_error) {
    lane->state = IDLE;
    lane->mpi_error = mpi_error;
    return RL_MPI_ERROR;
}

/* The end of a round: OK and NOT_UNANIMOUS complete it, on every member alike. */
static int finished(rl_lane *lane, int outcome) {
    lane->state = IDLE;
    lane->steps++;
    return outcome;
}

/* Copy the six fields of the last summed record into out[FIELDS]. */
void rl_lane_summed(void *handle, double *out) {
    memcpy(out, ((rl_lane *)handle)->summed, sizeof(double) * FIELDS);
}

static int unanimous(const rl_lane *lane) {
    const double *s = lane->summed, n = s[0], p = (double)lane->plan, t = (double)lane->step;
    if (s[5] != lane->size || n != lane->size || lane->plan == 0) return 0;
    return s[1] == n * p && s[2] == n * p * p && s[3] == n * t && s[4] == n * t * t;
}

static size_t element_size(const rl_lane *lane) { return lane->dtype == 0 ? 4 : 8; }

static void scale(rl_lane *lane) {
    if (!lane->average || lane->size == 1) return;
    if (lane->dtype == 0) {
        float f = (float)(1.0 / lane->size), *x = lane->buffer;
        for (int i = 0; i < lane->count; i++) x[i] *= f;
    } else {
        double f = 1.0 / lane->size, *x = lane->buffer;
        for (int i = 0; i < lane->count; i++) x[i] *= f;
    }
}

static void fill_slot(rl_lane *lane) {
    memset(lane->mine + FIELDS, 0, sizeof(double) * SMALL);
    if (lane->plan == 0 || lane->count > SMALL) return;
    if (lane->dtype == 0) {
        const float *x = lane->buffer;
        for (int i = 0; i < lane->count; i++) lane->mine[FIELDS + i] = x[i];
    } else {
        memcpy(lane->mine + FIELDS, lane->buffer, sizeof(double) * lane->count);
    }
}

static void empty_slot(rl_lane *lane) {
    if (lane->dtype == 0) {
        float *x = lane->buffer;
        for (int i = 0; i < lane->count; i++) x[i] = (float)lane->summed[FIELDS + i];
    } else {
        memcpy(lane->buffer, lane->summed + FIELDS, sizeof(double) * lane->count);
    }
}

/* Run (or continue) one round. plan: 1..2^20-1 for a planned call, 0 for "something else"
 * (the record still counts, so every member learns that this round is not the plan's).
 * The round's step is the count of rounds completed, modulo 2^20. buffer/count/dtype (0 float32, 1 float64)/average: the data, used when
 * the record proves every member is at this step of this plan. A pending call continues
 * with what was posted; the arguments of the continuing call are ignored. Returns
 * RL_AGREED when the data must go through rl_lane_data. */
int rl_lane_run(void *handle, int64_t plan, void *buffer, int count, int dtype, int average,
                double deadline_s) {
    rl_lane *lane = handle;
    int done = 0, rc;
    if (lane->state == IDLE) {
        if (dtype != 0 && dtype != 1) return RL_BAD_ARGUMENT;
        lane->plan = plan; lane->step = lane->steps % STEP_MODULUS;
        lane->buffer = buffer; lane->count = count; lane->dtype = dtype;
        lane->average = average;
        double on = plan != 0, p = (double)plan, t = (double)lane->step;
        lane->mine[0] = on; lane->mine[1] = on * p; lane->mine[2] = on * p * p;
        lane->mine[3] = t; lane->mine[4] = t * t; lane->mine[5] = 1;
        fill_slot(lane);
        if (lane->record != MPI_REQUEST_NULL) {
            rc = MPI_Start(&lane->record);
            lane->record_active = rc == MPI_SUCCESS;
        } else {
            rc = MPI_Iallreduce(lane->mine, lane->summed, RECORD_LENGTH, MPI_DOUBLE, MPI_SUM,
                                lane->comm, &lane->request);
        }
        if (rc != MPI_SUCCESS) return failed(lane, rc);
        lane->state = RECORD;
        lane->phase_start = now_s();
    }
    if (lane->state == RECORD) {
        /* a persistent request stays allocated when done: MPI_Test only makes it inactive */
        MPI_Request *record = lane->record != MPI_REQUEST_NULL ? &lane->record : &lane->request;
        rc = wait_bounded(record, lane->phase_start, deadline_s, &done);
        if (rc != MPI_SUCCESS) return failed(lane, rc);
        if (!done) return RL_RECORD_PENDING;
        lane->record_active = 0;
        if (!unanimous(lane)) return finished(lane, RL_NOT_UNANIMOUS);
        if (lane->count <= SMALL) {
            empty_slot(lane);
            scale(lane);
            return finished(lane, RL_OK);
        }
        if ((size_t)lane->count * element_size(lane) >= BLOCKING_BYTES) {
            lane->state = AGREED;
            return RL_AGREED;
        }
        MPI_Datatype type = lane->dtype == 0 ? MPI_FLOAT : MPI_DOUBLE;
        rc = MPI_Iallreduce(MPI_IN_PLACE, lane->buffer, lane->count, type, MPI_SUM,
                            lane->comm, &lane->request);
        if (rc != MPI_SUCCESS) return failed(lane, rc);
        lane->state = DATA;
        lane->phase_start = now_s();
    }
    if (lane->state == DATA) {
        rc = wait_bounded(&lane->request, lane->phase_start, deadline_s, &done);
        if (rc != MPI_SUCCESS) return failed(lane, rc);
        if (!done) return RL_DATA_PENDING;
        scale(lane);
        return finished(lane, RL_OK);
    }
    if (lane->state == AGREED) return RL_AGREED;
    return RL_BAD_ARGUMENT;
}

/* The data phase of an agreed step too big for the slot: a blocking MPI_Allreduce in
 * place (faster than the non-blocking one at these sizes), then the scaling. */
int rl_lane_data(void *handle) {
    rl_lane *lane = handle;
    if (lane->state != AGREED) return RL_BAD_ARGUMENT;
    MPI_Datatype type = lane->dtype == 0 ? MPI_FLOAT : MPI_DOUBLE;
    int rc = MPI_Allreduce(MPI_IN_PLACE, lane->buffer, lane->count, type, MPI_SUM, lane->comm);
    if (rc != MPI_SUCCESS) return failed(lane, rc);
    scale(lane);
    return finished(lane, RL_OK);
}

/* A planned call in the steady state: a new round of `call`'s plan on `buffer`. */
int rl_lane_call(const rl_call *call, void *buffer) {
    rl_lane *lane = call->lane;
    if (lane->state != IDLE) return RL_BAD_ARGUMENT;
    return rl_lane_run(lane, call->plan, buffer, call->count, call->dtype, call->average,
                       call->first_wait_s);
}
