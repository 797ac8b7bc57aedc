package main

import (
	"slices"
	"strings"
)

// A rule says which communication events a wrapper records. Its snippets are
// C statements placed in the wrapper (the generator indents them); they name
// the wrapped function's parameters directly, so every function given a rule
// must have the parameters listed in uses.
type rule struct {
	desc  string            // what the wrapper records, for its comment
	uses  []string          // parameters the snippets refer to
	pre   string            // after kp_enter, before the PMPI call
	subst map[string]string // parameters passed to PMPI as something else
	post  string            // after the PMPI call (rc holds its result), before kp_exit
	final string            // after kp_exit
	// The Fortran wrappers' snippets, run in place of pre, post and final
	// where set. The Fortran wrappers of a rule that uses parameters run
	// its snippets (these, or the C ones) on C locals of the parameters'
	// names converted from the Fortran arguments (f_ and the name), but for
	// the parameters in fown, which the Fortran snippets convert
	// themselves; rc is the error code. Without uses, the snippets name no
	// argument.
	fpre, fpost, ffinal string
	fsubst              map[string]string // Fortran arguments passed on as something else
	fown                []string          // parameters the Fortran snippets convert
	fout                []string          // parameters converted after the call (MPI_Request *)
	fafter              string            // right after the call and rc, before fpost or post
}

// fn is one wrapped MPI function.
type fn struct {
	proto string // the prototype exactly as OpenMPI 4.1's mpi.h declares it
	rule  rule
}

// The point-to-point, completion and lifecycle rules.
var (
	plain = rule{desc: "an execution, no communication events"}

	initRule = rule{
		desc: "an execution; once MPI is up, tells the core this process's world rank",
		post: "if (rc == MPI_SUCCESS)\n    kp_after_init();",
		fpost: "int up = 0;\n" +
			"if (PMPI_Initialized(&up) == MPI_SUCCESS && up)\n" +
			"    kp_after_init();",
	}

	finalizeRule = rule{
		desc:   "an execution; then flushes every buffered event",
		pre:    "kp_before_finalize();",
		final:  "kp_flush();",
		fpre:   "kp_before_finalize();",
		ffinal: "kp_flush();",
	}

	abortRule = rule{
		desc: "an execution; flushes first, since PMPI_Abort does not come back",
		pre:  "kp_flush();",
		fpre: "kp_flush();",
	}

	sendRule = rule{
		desc: "KP_SEND to dest when the send is posted",
		uses: []string{"count", "datatype", "dest", "tag", "comm"},
		post: "if (rc == MPI_SUCCESS)\n    kp_send_event(comm, dest, tag, count, datatype);",
	}

	recvRule = withStatus(rule{
		desc: "KP_RECV from the status once the message is in",
		uses: []string{"comm", "status"},
		post: "if (rc == MPI_SUCCESS)\n    kp_recv_done(comm, st);",
	})

	sendrecvRule = withStatus(rule{
		desc: "KP_SEND to dest, then KP_RECV from the status",
		uses: []string{"sendcount", "sendtype", "dest", "sendtag", "comm", "status"},
		post: "if (rc == MPI_SUCCESS) {\n" +
			"    kp_send_event(comm, dest, sendtag, sendcount, sendtype);\n" +
			"    kp_recv_done(comm, st);\n" +
			"}",
	})

	sendrecvReplaceRule = withStatus(rule{
		desc: "KP_SEND to dest, then KP_RECV from the status",
		uses: []string{"count", "datatype", "dest", "sendtag", "comm", "status"},
		post: "if (rc == MPI_SUCCESS) {\n" +
			"    kp_send_event(comm, dest, sendtag, count, datatype);\n" +
			"    kp_recv_done(comm, st);\n" +
			"}",
	})

	irecvRule = rule{
		desc: "no event yet: remembers the request, whose completion records the KP_RECV",
		uses: []string{"source", "comm", "request"},
		post: "if (rc == MPI_SUCCESS && source != MPI_PROC_NULL)\n    kp_req_track(*request, comm);",
		fout: []string{"request"},
	}

	// A persistent request's arguments are saved when it is made; each
	// MPI_Start of a send records its KP_SEND, and a started receive is
	// pending, like an MPI_Irecv, until a completion call completes it.
	psendRule = rule{
		desc: "no event yet: remembers the persistent send, whose every MPI_Start records a KP_SEND to dest",
		uses: []string{"count", "datatype", "dest", "tag", "comm", "request"},
		post: "if (rc == MPI_SUCCESS)\n    kp_preq_send(*request, comm, dest, tag, count, datatype);",
		fout: []string{"request"},
	}

	precvRule = rule{
		desc: "no event yet: remembers the persistent receive, which each MPI_Start makes pending",
		uses: []string{"source", "comm", "request"},
		post: "if (rc == MPI_SUCCESS && source != MPI_PROC_NULL)\n    kp_preq_recv(*request, comm);",
		fout: []string{"request"},
	}

	startRule = rule{
		desc: "KP_SEND of a persistent send; a persistent receive becomes pending, and its completion records the KP_RECV",
		uses: []string{"request"},
		post: "if (rc == MPI_SUCCESS)\n    kp_preq_start(*request);",
	}

	startallRule = rule{
		desc: "KP_SEND of each persistent send; each persistent receive becomes pending, and its completion records the KP_RECV",
		uses: []string{"count", "array_of_requests"},
		post: "if (rc == MPI_SUCCESS)\n" +
			"    for (int i = 0; i < count; i++)\n" +
			"        kp_preq_start(array_of_requests[i]);",
		fown: []string{"array_of_requests"},
		fpost: "if (rc == MPI_SUCCESS)\n" +
			"    for (int i = 0; i < count; i++)\n" +
			"        kp_preq_start(kp_freq((const MPI_Fint *)f_array_of_requests + i));",
	}

	requestFreeRule = rule{
		desc: "an execution; forgets the request if it was a pending MPI_Irecv or a persistent request",
		uses: []string{"request"},
		pre:  "if (request != NULL)\n    kp_req_drop(*request);",
	}

	waitRule = completion("request", "1", "status", "1", "MPI_STATUS_IGNORE",
		"1, KP_BY_POSITION, 0, NULL", "1, KP_BY_POSITION, 0, NULL")
	testRule = completion("request", "1", "status", "1", "MPI_STATUS_IGNORE",
		"*flag, KP_BY_POSITION, 0, NULL", "kp_fint(f_flag) != 0, KP_BY_POSITION, 0, NULL", "flag")
	waitallRule = completion("array_of_requests", "count", "array_of_statuses", "count",
		"MPI_STATUSES_IGNORE", "1, KP_BY_POSITION, 0, NULL", "1, KP_BY_POSITION, 0, NULL")
	testallRule = completion("array_of_requests", "count", "array_of_statuses", "count",
		"MPI_STATUSES_IGNORE", "*flag, KP_BY_POSITION, 0, NULL",
		"kp_fint(f_flag) != 0, KP_BY_POSITION, 0, NULL", "flag")
	waitanyRule = completion("array_of_requests", "count", "status", "1", "MPI_STATUS_IGNORE",
		"1, KP_BY_INDEX, 1, index", "1, KP_BY_INDEX, 1, f_index", "index")
	testanyRule  = waitanyRule
	waitsomeRule = completion("array_of_requests", "incount", "array_of_statuses", "incount",
		"MPI_STATUSES_IGNORE", "1, KP_BY_INDEX, *outcount, array_of_indices",
		"1, KP_BY_INDEX, kp_fint(f_outcount), f_array_of_indices", "outcount", "array_of_indices")
	testsomeRule = waitsomeRule
)

// withStatus completes r, a rule whose post reads the status of a receive
// as st: the C wrapper points st at a local status when the caller ignores
// it; the Fortran wrapper passes on a local Fortran status when the caller
// ignores it, and converts the one the MPI filled into st.
func withStatus(r rule) rule {
	r.pre = "MPI_Status kp_st;\n" +
		"MPI_Status *st = status == MPI_STATUS_IGNORE ? &kp_st : status;"
	r.subst = map[string]string{"status": "st"}
	r.fpre = "MPI_Status kp_fst, kp_st, *st = &kp_st;\n" +
		"void *f_st = kp_fstatus_arg(f_status, &kp_fst);"
	r.fsubst = map[string]string{"status": "f_st"}
	r.fown = []string{"status"}
	r.fafter = "if (rc == MPI_SUCCESS)\n    kp_fstatus(f_st, st);"
	return r
}

// completion is the rule of a call that completes requests: KP_RECV for each
// pending receive (an MPI_Irecv, a started persistent receive) it
// completes. reqs and count name the request array, sts and nst the status
// array (nst statuses), ignore is the caller's "no statuses" value, and
// find the last arguments of kp_completion_end from its flag on (ffind of
// kp_fcompletion_end, over the Fortran arguments), which name the
// parameters in more.
func completion(reqs, count, sts, nst, ignore, find, ffind string, more ...string) rule {
	uses := append([]string{reqs, sts}, more...)
	for _, p := range []string{count, nst} {
		if p != "1" && !slices.Contains(uses, p) {
			uses = append(uses, p)
		}
	}
	many := "0"
	if ignore == "MPI_STATUSES_IGNORE" {
		many = "1"
	}
	return rule{
		desc: "KP_RECV for each pending MPI_Irecv or started persistent receive it completes, from its status",
		uses: uses,
		pre: "kp_completion cp;\n" +
			"MPI_Status *st = " + sts + ";\n" +
			"kp_completion_begin(&cp, " + count + ", " + reqs + ", &st, " + nst + ", " + ignore + ");",
		subst: map[string]string{sts: "st"},
		post:  "kp_completion_end(&cp, rc, " + reqs + ", st, " + find + ");",
		fpre: "kp_fcompletion fc;\n" +
			"void *f_st = kp_fcompletion_begin(&fc, " + count + ", f_" + reqs + ", f_" + sts + ", " + nst + ", " + many + ");",
		fsubst: map[string]string{sts: "f_st"},
		fown:   append([]string{reqs, sts}, more...),
		fpost:  "kp_fcompletion_end(&fc, rc, f_" + reqs + ", f_st, " + ffind + ");",
	}
}

// collective is the rule of a collective: one KP_SEND of the bytes this
// process contributes (sent) and one KP_RECV of the bytes it receives (got),
// both C expressions over the kp_coll c; zero sizes record nothing. root is
// the root parameter, or "" for collectives without one.
func collective(root, sent, got string, uses ...string) rule {
	desc := "KP_SEND of the bytes this process contributes, KP_RECV of the bytes it receives; partner itself"
	rootArg := "KP_NO_ROOT"
	if root != "" {
		desc = "KP_SEND of the bytes this process contributes, KP_RECV of the bytes it receives; partner the root"
		rootArg = root
		uses = append(uses, root)
	}
	// Multi-line expressions continue under their first character.
	sent = strings.ReplaceAll(sent, "\n", "\n"+strings.Repeat(" ", len("        uint64_t sent = ")))
	got = strings.ReplaceAll(got, "\n", "\n"+strings.Repeat(" ", len("        uint64_t got = ")))
	return rule{
		desc: desc,
		uses: append(uses, "comm"),
		post: "if (rc == MPI_SUCCESS) {\n" +
			"    kp_coll c;\n" +
			"    if (kp_coll_begin(&c, comm, " + rootArg + ")) {\n" +
			"        uint64_t sent = " + sent + ";\n" +
			"        uint64_t got = " + got + ";\n" +
			"        kp_coll_emit(&c, sent, got);\n" +
			"    }\n" +
			"}",
	}
}

// Byte counts of the collectives. MPI_IN_PLACE moves where a process's own
// block lives, not how much of it takes part: the sizes are those of the
// same call with separate buffers, taken from the arguments the standard
// says describe the block in place. Arguments the standard calls
// insignificant at a process are never read there.
var (
	bcastRule = collective("root",
		"c.root ? kp_bytes(count, datatype) : 0",
		"c.root ? 0 : kp_bytes(count, datatype)",
		"count", "datatype")
	reduceRule = collective("root",
		"c.peer ? kp_bytes(count, datatype) : 0",
		"c.root ? kp_bytes(count, datatype) : 0",
		"count", "datatype")
	gatherRule = collective("root",
		"!c.peer ? 0\n: sendbuf == MPI_IN_PLACE ? kp_bytes(recvcount, recvtype)\n: kp_bytes(sendcount, sendtype)",
		"c.root ? kp_bytes(recvcount, recvtype) * (uint64_t)c.n : 0",
		"sendbuf", "sendcount", "sendtype", "recvcount", "recvtype")
	gathervRule = collective("root",
		"!c.peer ? 0\n: sendbuf == MPI_IN_PLACE ? kp_bytes(recvcounts[c.me], recvtype)\n: kp_bytes(sendcount, sendtype)",
		"c.root ? kp_bytes_sum(recvcounts, c.n, recvtype) : 0",
		"sendbuf", "sendcount", "sendtype", "recvcounts", "recvtype")
	scatterRule = collective("root",
		"c.root ? kp_bytes(sendcount, sendtype) * (uint64_t)c.n : 0",
		"!c.peer ? 0\n: recvbuf == MPI_IN_PLACE ? kp_bytes(sendcount, sendtype)\n: kp_bytes(recvcount, recvtype)",
		"sendcount", "sendtype", "recvbuf", "recvcount", "recvtype")
	scattervRule = collective("root",
		"c.root ? kp_bytes_sum(sendcounts, c.n, sendtype) : 0",
		"!c.peer ? 0\n: recvbuf == MPI_IN_PLACE ? kp_bytes(sendcounts[c.me], sendtype)\n: kp_bytes(recvcount, recvtype)",
		"sendcounts", "sendtype", "recvbuf", "recvcount", "recvtype")
	allreduceRule = collective("",
		"kp_bytes(count, datatype)",
		"kp_bytes(count, datatype)",
		"count", "datatype")
	allgatherRule = collective("",
		"sendbuf == MPI_IN_PLACE ? kp_bytes(recvcount, recvtype)\n: kp_bytes(sendcount, sendtype)",
		"kp_bytes(recvcount, recvtype) * (uint64_t)c.n",
		"sendbuf", "sendcount", "sendtype", "recvcount", "recvtype")
	allgathervRule = collective("",
		"sendbuf == MPI_IN_PLACE ? kp_bytes(recvcounts[c.me], recvtype)\n: kp_bytes(sendcount, sendtype)",
		"kp_bytes_sum(recvcounts, c.n, recvtype)",
		"sendbuf", "sendcount", "sendtype", "recvcounts", "recvtype")
	alltoallRule = collective("",
		"sendbuf == MPI_IN_PLACE ? kp_bytes(recvcount, recvtype) * (uint64_t)c.n\n: kp_bytes(sendcount, sendtype) * (uint64_t)c.n",
		"kp_bytes(recvcount, recvtype) * (uint64_t)c.n",
		"sendbuf", "sendcount", "sendtype", "recvcount", "recvtype")
	alltoallvRule = collective("",
		"sendbuf == MPI_IN_PLACE ? kp_bytes_sum(recvcounts, c.n, recvtype)\n: kp_bytes_sum(sendcounts, c.n, sendtype)",
		"kp_bytes_sum(recvcounts, c.n, recvtype)",
		"sendbuf", "sendcounts", "sendtype", "recvcounts", "recvtype")
	reduceScatterRule = collective("",
		"kp_bytes_sum(recvcounts, c.lsize, datatype)",
		"kp_bytes(recvcounts[c.me], datatype)",
		"recvcounts", "datatype")
	reduceScatterBlockRule = collective("",
		"kp_bytes(recvcount, datatype) * (uint64_t)c.lsize",
		"kp_bytes(recvcount, datatype)",
		"recvcount", "datatype")
	scanRule = allreduceRule
	// MPI_Exscan leaves recvbuf undefined at rank 0.
	exscanRule = collective("",
		"kp_bytes(count, datatype)",
		"c.me == 0 ? 0 : kp_bytes(count, datatype)",
		"count", "datatype")
)

// functions lists the wrapped MPI functions, in the order of the generated
// file. MPI_Wtime and MPI_Wtick are left out on purpose: they are called in
// tight loops and tell nothing about communication.
var functions = []fn{
	// Start and end.
	{"int MPI_Init(int *argc, char ***argv)", initRule},
	{"int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)", initRule},
	{"int MPI_Finalize(void)", finalizeRule},
	{"int MPI_Abort(MPI_Comm comm, int errorcode)", abortRule},

	// Communicators.
	{"int MPI_Comm_rank(MPI_Comm comm, int *rank)", plain},
	{"int MPI_Comm_size(MPI_Comm comm, int *size)", plain},
	{"int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm)", plain},
	{"int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm)", plain},
	{"int MPI_Comm_free(MPI_Comm *comm)", plain},
	{"int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm *newcomm)", plain},
	{"int MPI_Cart_create(MPI_Comm old_comm, int ndims, const int dims[], const int periods[], int reorder, MPI_Comm *comm_cart)", plain},
	{"int MPI_Cart_shift(MPI_Comm comm, int direction, int disp, int *rank_source, int *rank_dest)", plain},
	{"int MPI_Cart_sub(MPI_Comm comm, const int remain_dims[], MPI_Comm *new_comm)", plain},

	// Datatypes, operations, packing.
	{"int MPI_Type_commit(MPI_Datatype *type)", plain},
	{"int MPI_Type_free(MPI_Datatype *type)", plain},
	{"int MPI_Type_contiguous(int count, MPI_Datatype oldtype, MPI_Datatype *newtype)", plain},
	{"int MPI_Type_vector(int count, int blocklength, int stride, MPI_Datatype oldtype, MPI_Datatype *newtype)", plain},
	{"int MPI_Type_create_struct(int count, const int array_of_block_lengths[], const MPI_Aint array_of_displacements[], const MPI_Datatype array_of_types[], MPI_Datatype *newtype)", plain},
	{"int MPI_Op_create(MPI_User_function *function, int commute, MPI_Op *op)", plain},
	{"int MPI_Op_free(MPI_Op *op)", plain},
	{"int MPI_Get_count(const MPI_Status *status, MPI_Datatype datatype, int *count)", plain},
	{"int MPI_Pack(const void *inbuf, int incount, MPI_Datatype datatype, void *outbuf, int outsize, int *position, MPI_Comm comm)", plain},
	{"int MPI_Unpack(const void *inbuf, int insize, int *position, void *outbuf, int outcount, MPI_Datatype datatype, MPI_Comm comm)", plain},

	// Blocking point-to-point.
	{"int MPI_Send(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)", sendRule},
	{"int MPI_Ssend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)", sendRule},
	{"int MPI_Bsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)", sendRule},
	{"int MPI_Rsend(const void *ibuf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)", sendRule},
	{"int MPI_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm, MPI_Status *status)", recvRule},
	{"int MPI_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag, void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag, MPI_Comm comm, MPI_Status *status)", sendrecvRule},
	{"int MPI_Sendrecv_replace(void * buf, int count, MPI_Datatype datatype, int dest, int sendtag, int source, int recvtag, MPI_Comm comm, MPI_Status *status)", sendrecvReplaceRule},
	{"int MPI_Probe(int source, int tag, MPI_Comm comm, MPI_Status *status)", plain},
	{"int MPI_Iprobe(int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status)", plain},

	// Non-blocking point-to-point.
	{"int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", sendRule},
	{"int MPI_Issend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", sendRule},
	{"int MPI_Ibsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", sendRule},
	{"int MPI_Irsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", sendRule},
	{"int MPI_Irecv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm, MPI_Request *request)", irecvRule},

	// Persistent requests.
	{"int MPI_Send_init(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", psendRule},
	{"int MPI_Bsend_init(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", psendRule},
	{"int MPI_Ssend_init(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", psendRule},
	{"int MPI_Rsend_init(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request *request)", psendRule},
	{"int MPI_Recv_init(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm, MPI_Request *request)", precvRule},
	{"int MPI_Start(MPI_Request *request)", startRule},
	{"int MPI_Startall(int count, MPI_Request array_of_requests[])", startallRule},

	// Completion.
	{"int MPI_Wait(MPI_Request *request, MPI_Status *status)", waitRule},
	{"int MPI_Waitall(int count, MPI_Request array_of_requests[], MPI_Status *array_of_statuses)", waitallRule},
	{"int MPI_Waitany(int count, MPI_Request array_of_requests[], int *index, MPI_Status *status)", waitanyRule},
	{"int MPI_Waitsome(int incount, MPI_Request array_of_requests[], int *outcount, int array_of_indices[], MPI_Status array_of_statuses[])", waitsomeRule},
	{"int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status)", testRule},
	{"int MPI_Testall(int count, MPI_Request array_of_requests[], int *flag, MPI_Status array_of_statuses[])", testallRule},
	{"int MPI_Testany(int count, MPI_Request array_of_requests[], int *index, int *flag, MPI_Status *status)", testanyRule},
	{"int MPI_Testsome(int incount, MPI_Request array_of_requests[], int *outcount, int array_of_indices[], MPI_Status array_of_statuses[])", testsomeRule},
	{"int MPI_Request_free(MPI_Request *request)", requestFreeRule},

	// Blocking collectives.
	{"int MPI_Barrier(MPI_Comm comm)", plain},
	{"int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm)", bcastRule},
	{"int MPI_Reduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, int root, MPI_Comm comm)", reduceRule},
	{"int MPI_Gather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)", gatherRule},
	{"int MPI_Gatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root, MPI_Comm comm)", gathervRule},
	{"int MPI_Scatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)", scatterRule},
	{"int MPI_Scatterv(const void *sendbuf, const int sendcounts[], const int displs[], MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)", scattervRule},
	{"int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)", allreduceRule},
	{"int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm)", allgatherRule},
	{"int MPI_Allgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm)", allgathervRule},
	{"int MPI_Alltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm)", alltoallRule},
	{"int MPI_Alltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm)", alltoallvRule},
	{"int MPI_Reduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[], MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)", reduceScatterRule},
	{"int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)", reduceScatterBlockRule},
	{"int MPI_Scan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)", scanRule},
	{"int MPI_Exscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)", exscanRule},

	// Non-blocking collectives: recorded at the call, by the rule of their
	// blocking twin (the buffers and counts may not change until they
	// complete, so the sizes are those of the call).
	{"int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request)", plain},
	{"int MPI_Ibcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm, MPI_Request *request)", bcastRule},
	{"int MPI_Ireduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, int root, MPI_Comm comm, MPI_Request *request)", reduceRule},
	{"int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request)", allreduceRule},
	{"int MPI_Iallgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)", allgatherRule},
	{"int MPI_Ialltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)", alltoallRule},
	{"int MPI_Igather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request *request)", gatherRule},
	{"int MPI_Igatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request *request)", gathervRule},
	{"int MPI_Iscatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request *request)", scatterRule},
	{"int MPI_Iscatterv(const void *sendbuf, const int sendcounts[], const int displs[], MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request *request)", scattervRule},
	{"int MPI_Iallgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)", allgathervRule},
	{"int MPI_Ialltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)", alltoallvRule},
	{"int MPI_Ireduce_scatter(const void *sendbuf, void *recvbuf, const int recvcounts[], MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request)", reduceScatterRule},
	{"int MPI_Ireduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request)", reduceScatterBlockRule},
	{"int MPI_Iscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request)", scanRule},
	{"int MPI_Iexscan(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request)", exscanRule},
}
