/* Run requests against a SavedModel through TensorFlow's C API: no Python.

   TF Serving loads a SavedModel with TensorFlow's C++ loader and feeds the
   signature's tensors by name. This program does the same with the C API that
   the TensorFlow wheel ships (libtensorflow_cc), so an export can be checked
   where no model server can be installed. `pipelines.cloader` compiles
   it, writes the requests and reads the responses.

   Usage:
     savedmodel_run EXPORT_DIR REQUESTS RESPONSES [--library OPS.so]...
     savedmodel_run EXPORT_DIR REQUESTS - --bench THREADS ITERATIONS [...]

   REQUESTS (little-endian): "ALRQ", u32 count, then per request: u32 feeds,
   per feed a name (u32 length + bytes) and a tensor; u32 fetches, per fetch a
   name. A tensor is u32 dtype (TF_DataType), u32 rank, i64 dims[rank], then
   for TF_STRING one (u64 length + bytes) per element, otherwise u64 bytes +
   the raw values.
   RESPONSES: "ALRS", u32 count, then per request: i32 status code (0 is OK),
   the status message (u32 length + bytes), u32 outputs, one tensor each.
   A failing request does not stop the others: the model keeps serving.
   --bench runs the first request once untimed (a warmup), then ITERATIONS
   times from each of THREADS threads, and prints one line on stdout:
   "requests N failures F p50_ms X p99_ms X mean_ms X requests_per_s X"
   (exit status 1 if any failed).
*/
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensorflow/c/c_api.h"
#include "tensorflow/c/tf_tstring.h"

typedef struct {
  char *name;
  TF_DataType dtype;
  int rank;
  int64_t dims[8];
  size_t count;      /* elements */
  size_t nbytes;     /* numeric payload */
  char *raw;         /* numeric payload */
  char **strings;    /* TF_STRING elements */
  uint64_t *lengths; /* TF_STRING element sizes */
} Feed;

typedef struct {
  int nfeeds, nfetches;
  Feed *feeds;
  char **fetches;
} Request;

static void die(const char *message) {
  fprintf(stderr, "savedmodel_run: %s\n", message);
  exit(2);
}

static void read_exact(FILE *f, void *out, size_t n) {
  if (n && fread(out, 1, n, f) != n) die("truncated request file");
}

static uint32_t read_u32(FILE *f) {
  uint32_t v;
  read_exact(f, &v, 4);
  return v;
}

static uint64_t read_u64(FILE *f) {
  uint64_t v;
  read_exact(f, &v, 8);
  return v;
}

static char *read_name(FILE *f) {
  uint32_t n = read_u32(f);
  char *s = malloc(n + 1);
  read_exact(f, s, n);
  s[n] = 0;
  return s;
}

static void read_tensor(FILE *f, Feed *t) {
  t->dtype = (TF_DataType)read_u32(f);
  t->rank = (int)read_u32(f);
  if (t->rank > 8) die("rank above 8");
  t->count = 1;
  for (int i = 0; i < t->rank; i++) {
    t->dims[i] = (int64_t)read_u64(f);
    t->count *= (size_t)t->dims[i];
  }
  if (t->dtype == TF_STRING) {
    t->strings = calloc(t->count ? t->count : 1, sizeof(char *));
    t->lengths = calloc(t->count ? t->count : 1, sizeof(uint64_t));
    for (size_t i = 0; i < t->count; i++) {
      t->lengths[i] = read_u64(f);
      t->strings[i] = malloc(t->lengths[i] + 1);
      read_exact(f, t->strings[i], t->lengths[i]);
    }
  } else {
    t->nbytes = read_u64(f);
    t->raw = malloc(t->nbytes ? t->nbytes : 1);
    read_exact(f, t->raw, t->nbytes);
  }
}

static Request *read_requests(const char *path, uint32_t *count) {
  FILE *f = fopen(path, "rb");
  if (!f) die("cannot open the request file");
  char magic[4];
  read_exact(f, magic, 4);
  if (memcmp(magic, "ALRQ", 4)) die("not a request file");
  *count = read_u32(f);
  Request *requests = calloc(*count ? *count : 1, sizeof(Request));
  for (uint32_t r = 0; r < *count; r++) {
    Request *q = &requests[r];
    q->nfeeds = (int)read_u32(f);
    q->feeds = calloc(q->nfeeds ? q->nfeeds : 1, sizeof(Feed));
    for (int i = 0; i < q->nfeeds; i++) {
      q->feeds[i].name = read_name(f);
      read_tensor(f, &q->feeds[i]);
    }
    q->nfetches = (int)read_u32(f);
    q->fetches = calloc(q->nfetches ? q->nfetches : 1, sizeof(char *));
    for (int i = 0; i < q->nfetches; i++) q->fetches[i] = read_name(f);
  }
  fclose(f);
  return requests;
}

/* "op:index" to a TF_Output of the graph; NULL operation if unknown. */
static TF_Output output_named(TF_Graph *graph, const char *name) {
  char op[1024];
  int index = 0;
  const char *colon = strrchr(name, ':');
  size_t n = colon ? (size_t)(colon - name) : strlen(name);
  if (n >= sizeof(op)) n = sizeof(op) - 1;
  memcpy(op, name, n);
  op[n] = 0;
  if (colon) index = atoi(colon + 1);
  TF_Output out = {TF_GraphOperationByName(graph, op), index};
  return out;
}

static TF_Tensor *make_tensor(const Feed *t) {
  if (t->dtype != TF_STRING) {
    TF_Tensor *tensor = TF_AllocateTensor(t->dtype, t->dims, t->rank, t->nbytes);
    if (tensor && t->nbytes) memcpy(TF_TensorData(tensor), t->raw, t->nbytes);
    return tensor;
  }
  TF_Tensor *tensor = TF_AllocateTensor(TF_STRING, t->dims, t->rank,
                                        t->count * sizeof(TF_TString));
  TF_TString *data = (TF_TString *)TF_TensorData(tensor);
  for (size_t i = 0; i < t->count; i++) {
    TF_StringInit(&data[i]);
    TF_StringCopy(&data[i], t->strings[i], t->lengths[i]);
  }
  return tensor;
}

static void free_input(TF_Tensor *tensor) {
  if (!tensor) return;
  if (TF_TensorType(tensor) == TF_STRING) {
    TF_TString *data = (TF_TString *)TF_TensorData(tensor);
    size_t n = TF_TensorElementCount(tensor);
    for (size_t i = 0; i < n; i++) TF_StringDealloc(&data[i]);
  }
  TF_DeleteTensor(tensor);
}

static void write_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }
static void write_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void write_bytes(FILE *f, const char *s, size_t n) {
  write_u32(f, (uint32_t)n);
  fwrite(s, 1, n, f);
}

static void write_tensor(FILE *f, TF_Tensor *t) {
  TF_DataType dtype = TF_TensorType(t);
  int rank = TF_NumDims(t);
  write_u32(f, (uint32_t)dtype);
  write_u32(f, (uint32_t)rank);
  for (int i = 0; i < rank; i++) write_u64(f, (uint64_t)TF_Dim(t, i));
  if (dtype == TF_STRING) {
    const TF_TString *data = (const TF_TString *)TF_TensorData(t);
    size_t n = TF_TensorElementCount(t);
    for (size_t i = 0; i < n; i++) {
      size_t size = TF_StringGetSize(&data[i]);
      write_u64(f, size);
      fwrite(TF_StringGetDataPointer(&data[i]), 1, size, f);
    }
  } else {
    size_t n = TF_TensorByteSize(t);
    write_u64(f, n);
    fwrite(TF_TensorData(t), 1, n, f);
  }
}

typedef struct {
  TF_Session *session;
  TF_Graph *graph;
  const Request *request;
} Server;

/* One request; returns the status code and fills outputs (NULL on error). */
static int run_request(const Server *server, TF_Tensor **outputs,
                       char *message, size_t message_size) {
  const Request *q = server->request;
  TF_Status *status = TF_NewStatus();
  TF_Output *inputs = calloc(q->nfeeds ? q->nfeeds : 1, sizeof(TF_Output));
  TF_Tensor **values = calloc(q->nfeeds ? q->nfeeds : 1, sizeof(TF_Tensor *));
  TF_Output *fetches = calloc(q->nfetches ? q->nfetches : 1, sizeof(TF_Output));
  int code = 0;
  for (int i = 0; i < q->nfeeds && !code; i++) {
    inputs[i] = output_named(server->graph, q->feeds[i].name);
    values[i] = make_tensor(&q->feeds[i]);
    if (!inputs[i].oper || !values[i]) {
      code = TF_INVALID_ARGUMENT;
      snprintf(message, message_size, "no feed tensor %s", q->feeds[i].name);
    }
  }
  for (int i = 0; i < q->nfetches && !code; i++) {
    fetches[i] = output_named(server->graph, q->fetches[i]);
    if (!fetches[i].oper) {
      code = TF_INVALID_ARGUMENT;
      snprintf(message, message_size, "no fetch tensor %s", q->fetches[i]);
    }
  }
  if (!code) {
    TF_SessionRun(server->session, NULL, inputs, values, q->nfeeds, fetches,
                  outputs, q->nfetches, NULL, 0, NULL, status);
    code = (int)TF_GetCode(status);
    snprintf(message, message_size, "%s", TF_Message(status));
  }
  for (int i = 0; i < q->nfeeds; i++) free_input(values[i]);
  free(inputs);
  free(values);
  free(fetches);
  TF_DeleteStatus(status);
  return code;
}

typedef struct {
  Server server;
  int iterations;
  double *latencies;
  int failures;
} Worker;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *bench_worker(void *arg) {
  Worker *w = (Worker *)arg;
  int n = w->server.request->nfetches;
  TF_Tensor **outputs = calloc(n ? n : 1, sizeof(TF_Tensor *));
  char message[4096];
  for (int i = 0; i < w->iterations; i++) {
    double start = now_ms();
    if (run_request(&w->server, outputs, message, sizeof(message))) w->failures++;
    w->latencies[i] = now_ms() - start;
    for (int k = 0; k < n; k++) {
      if (outputs[k]) TF_DeleteTensor(outputs[k]);
      outputs[k] = NULL;
    }
  }
  free(outputs);
  return NULL;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: savedmodel_run EXPORT_DIR REQUESTS RESPONSES "
            "[--library OPS.so]... [--bench THREADS ITERATIONS]\n");
    return 2;
  }
  int threads = 0, iterations = 0;
  TF_Status *status = TF_NewStatus();
  for (int i = 4; i < argc; i++) {
    if (!strcmp(argv[i], "--library") && i + 1 < argc) {
      TF_LoadLibrary(argv[++i], status);
      if (TF_GetCode(status) != TF_OK) {
        fprintf(stderr, "savedmodel_run: %s: %s\n", argv[i], TF_Message(status));
        return 2;
      }
    } else if (!strcmp(argv[i], "--bench") && i + 2 < argc) {
      threads = atoi(argv[++i]);
      iterations = atoi(argv[++i]);
      if (threads < 1 || iterations < 1) die("--bench needs THREADS and ITERATIONS >= 1");
    } else {
      fprintf(stderr, "savedmodel_run: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  uint32_t count;
  Request *requests = read_requests(argv[2], &count);

  TF_Graph *graph = TF_NewGraph();
  TF_SessionOptions *options = TF_NewSessionOptions();
  const char *tags[] = {"serve"};
  TF_Session *session = TF_LoadSessionFromSavedModel(
      options, NULL, argv[1], tags, 1, graph, NULL, status);
  if (TF_GetCode(status) != TF_OK) {
    fprintf(stderr, "savedmodel_run: load failed: %s\n", TF_Message(status));
    return 3;
  }

  if (threads > 0) {
    if (!count) die("--bench needs one request");
    /* One untimed run first, as TF Serving's warmup file does at load: it
       pays for the first call's setup (and an XLA compile). */
    {
      Server first = {session, graph, &requests[0]};
      int n = requests[0].nfetches;
      TF_Tensor **outputs = calloc(n ? n : 1, sizeof(TF_Tensor *));
      char message[4096];
      if (run_request(&first, outputs, message, sizeof(message))) {
        fprintf(stderr, "savedmodel_run: the warmup request failed: %s\n", message);
        return 1;
      }
      for (int k = 0; k < n; k++)
        if (outputs[k]) TF_DeleteTensor(outputs[k]);
      free(outputs);
    }
    Worker *workers = calloc(threads, sizeof(Worker));
    pthread_t *ids = calloc(threads, sizeof(pthread_t));
    double start = now_ms();
    for (int t = 0; t < threads; t++) {
      Server s = {session, graph, &requests[0]};
      workers[t].server = s;
      workers[t].iterations = iterations;
      workers[t].latencies = calloc(iterations, sizeof(double));
      pthread_create(&ids[t], NULL, bench_worker, &workers[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
    double elapsed = now_ms() - start;
    size_t total = (size_t)threads * iterations;
    double *all = malloc(total * sizeof(double));
    double sum = 0;
    int failures = 0;
    for (int t = 0; t < threads; t++) {
      memcpy(all + (size_t)t * iterations, workers[t].latencies,
             iterations * sizeof(double));
      failures += workers[t].failures;
    }
    for (size_t i = 0; i < total; i++) sum += all[i];
    qsort(all, total, sizeof(double), compare_doubles);
    printf("requests %zu failures %d p50_ms %.3f p99_ms %.3f mean_ms %.3f "
           "requests_per_s %.1f\n",
           total, failures, all[total / 2], all[(size_t)(total * 0.99)],
           sum / total, total / (elapsed / 1e3));
    return failures ? 1 : 0;
  }

  FILE *out = fopen(argv[3], "wb");
  if (!out) die("cannot open the response file");
  fwrite("ALRS", 1, 4, out);
  write_u32(out, count);
  char message[8192];
  for (uint32_t r = 0; r < count; r++) {
    Server server = {session, graph, &requests[r]};
    int n = requests[r].nfetches;
    TF_Tensor **outputs = calloc(n ? n : 1, sizeof(TF_Tensor *));
    message[0] = 0;
    int code = run_request(&server, outputs, message, sizeof(message));
    write_u32(out, (uint32_t)code);
    write_bytes(out, message, strlen(message));
    write_u32(out, code ? 0 : (uint32_t)n);
    for (int k = 0; k < n; k++) {
      if (!code) write_tensor(out, outputs[k]);
      if (outputs[k]) TF_DeleteTensor(outputs[k]);
    }
    free(outputs);
  }
  fclose(out);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteGraph(graph);
  TF_DeleteStatus(status);
  return 0;
}
