/*
 * persist.c: messages moved by persistent requests and by the non-blocking
 * collectives, each noted as the event library records it. On 2 ranks, N
 * times (the first argument, default 20), each rank:
 *
 *   - starts persistent sends and receives made once by MPI_Send_init,
 *     MPI_Ssend_init, MPI_Bsend_init, MPI_Rsend_init (rank 0 only) and
 *     MPI_Recv_init, with MPI_Start (7 calls) and MPI_Startall (3 calls),
 *     completed by MPI_Wait, MPI_Waitall, MPI_Test, MPI_Testall,
 *     MPI_Waitany, MPI_Waitsome and MPI_Testany, with statuses and with
 *     MPI_STATUS(ES)_IGNORE; one pair on a communicator whose ranks are the
 *     world's in reverse order, received from MPI_ANY_SOURCE;
 *   - calls MPI_Igather, MPI_Igatherv, MPI_Iscatter, MPI_Iscatterv,
 *     MPI_Iallgatherv, MPI_Ialltoallv, MPI_Ireduce_scatter,
 *     MPI_Ireduce_scatter_block, MPI_Iscan and MPI_Iexscan once each,
 *     completed by one MPI_Waitall.
 *
 * It frees the persistent requests with MPI_Request_free at the end.
 * Every message sent or received, and each collective's part, it counts as
 * the library records it (partner: a rank of MPI_COMM_WORLD, the
 * collective's root or itself; tag -1 for a collective; bytes; parts of
 * no bytes are not recorded) and writes the counts to DIR/expect.RANK (DIR
 * the second argument), one line per kind of message:
 *
 *   S 1 21 16 20
 *
 * kind (S send, R receive), partner, tag, bytes, messages. It prints its
 * rank and a checksum of what it received.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXNOTES 64
#define COLL (-1)

static struct {
	char kind;
	int partner, tag, bytes, n;
} notes[MAXNOTES];
static int nnotes;

/* note counts one message. */
static void note(char kind, int partner, int tag, int bytes)
{
	if (bytes == 0)
		return;
	for (int i = 0; i < nnotes; i++) {
		if (notes[i].kind == kind && notes[i].partner == partner && notes[i].tag == tag &&
		    notes[i].bytes == bytes) {
			notes[i].n++;
			return;
		}
	}
	if (nnotes == MAXNOTES) {
		fprintf(stderr, "persist: too many kinds of message\n");
		exit(1);
	}
	notes[nnotes].kind = kind;
	notes[nnotes].partner = partner;
	notes[nnotes].tag = tag;
	notes[nnotes].bytes = bytes;
	notes[nnotes].n = 1;
	nnotes++;
}

static void write_notes(const char *dir, int rank)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/expect.%d", dir, rank);
	FILE *f = fopen(path, "w");
	if (f == NULL) {
		perror(path);
		exit(1);
	}
	for (int i = 0; i < nnotes; i++)
		fprintf(f, "%c %d %d %d %d\n", notes[i].kind, notes[i].partner, notes[i].tag, notes[i].bytes,
		        notes[i].n);
	fclose(f);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 20;
	const char *dir = argc > 2 ? argv[2] : ".";
	int me, np;
	long total = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	MPI_Comm_size(MPI_COMM_WORLD, &np);
	if (np != 2) {
		if (me == 0)
			fprintf(stderr, "persist: run on 2 ranks\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int other = 1 - me;
	static char bsendbuf[1 << 16];
	MPI_Buffer_attach(bsendbuf, sizeof bsendbuf);

	/* rev numbers the ranks the other way round: world rank r is rank
	 * 1 - r, so the other rank is rank me of rev. */
	MPI_Comm rev;
	MPI_Comm_split(MPI_COMM_WORLD, 0, -me, &rev);

	int sa[4], ra[4], sb[2], rb[2], sc[3], rc[3], sd[5], rd[5], se[1], re[1], sf[6], rf[6];
	double sx[8], rx[8];
	MPI_Request s21, r21, s22, r22, s23, r23, s24 = MPI_REQUEST_NULL, r24 = MPI_REQUEST_NULL, s25, r25,
	                                          s26, r26, s27, r27;
	MPI_Send_init(sa, 4, MPI_INT, other, 21, MPI_COMM_WORLD, &s21);
	MPI_Recv_init(ra, 4, MPI_INT, other, 21, MPI_COMM_WORLD, &r21);
	MPI_Ssend_init(sx, 8, MPI_DOUBLE, other, 22, MPI_COMM_WORLD, &s22);
	MPI_Recv_init(rx, 8, MPI_DOUBLE, other, 22, MPI_COMM_WORLD, &r22);
	MPI_Bsend_init(sb, 2, MPI_INT, other, 23, MPI_COMM_WORLD, &s23);
	MPI_Recv_init(rb, 2, MPI_INT, other, 23, MPI_COMM_WORLD, &r23);
	if (me == 0)
		MPI_Rsend_init(sc, 3, MPI_INT, 1, 24, MPI_COMM_WORLD, &s24);
	else
		MPI_Recv_init(rc, 3, MPI_INT, 0, 24, MPI_COMM_WORLD, &r24);
	MPI_Send_init(sd, 5, MPI_INT, me, 25, rev, &s25);
	MPI_Recv_init(rd, 5, MPI_INT, MPI_ANY_SOURCE, 25, rev, &r25);
	MPI_Send_init(se, 1, MPI_INT, other, 26, MPI_COMM_WORLD, &s26);
	MPI_Recv_init(re, 1, MPI_INT, other, 26, MPI_COMM_WORLD, &r26);
	MPI_Send_init(sf, 6, MPI_INT, other, 27, MPI_COMM_WORLD, &s27);
	MPI_Recv_init(rf, 6, MPI_INT, other, 27, MPI_COMM_WORLD, &r27);

	for (int i = 0; i < n; i++) {
		MPI_Status st, sts[2];
		MPI_Request two[2];
		int flag, idx, outcount, indices[2], done;

		/* MPI_Start each, completed by MPI_Wait with a status. */
		for (int k = 0; k < 4; k++)
			sa[k] = me + i + k;
		MPI_Start(&r21);
		MPI_Start(&s21);
		MPI_Wait(&s21, MPI_STATUS_IGNORE);
		MPI_Wait(&r21, &st);
		note('S', other, 21, 16);
		note('R', other, 21, 16);
		total += ra[0];

		/* MPI_Startall, completed by MPI_Waitall without statuses. */
		for (int k = 0; k < 8; k++)
			sx[k] = me + i;
		two[0] = r22;
		two[1] = s22;
		MPI_Startall(2, two);
		MPI_Waitall(2, two, MPI_STATUSES_IGNORE);
		note('S', other, 22, 64);
		note('R', other, 22, 64);
		total += (long)rx[0];

		/* Buffered, the receive completed by MPI_Test. */
		sb[0] = sb[1] = me * 2 + i;
		MPI_Start(&r23);
		MPI_Start(&s23);
		flag = 0;
		while (!flag)
			MPI_Test(&r23, &flag, MPI_STATUS_IGNORE);
		MPI_Wait(&s23, MPI_STATUS_IGNORE);
		note('S', other, 23, 8);
		note('R', other, 23, 8);
		total += rb[1];

		/* Ready: the receive is started before the barrier, the send after;
		 * the receive completed by MPI_Waitany. */
		if (me == 1)
			MPI_Start(&r24);
		MPI_Barrier(MPI_COMM_WORLD);
		if (me == 0) {
			sc[0] = sc[1] = sc[2] = i;
			MPI_Start(&s24);
			MPI_Wait(&s24, MPI_STATUS_IGNORE);
			note('S', 1, 24, 12);
		} else {
			two[0] = MPI_REQUEST_NULL;
			two[1] = r24;
			MPI_Waitany(2, two, &idx, &st);
			if (idx != 1 || st.MPI_SOURCE != 0) {
				fprintf(stderr, "persist: MPI_Waitany: index %d source %d\n", idx, st.MPI_SOURCE);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
			note('R', 0, 24, 12);
			total += rc[2];
		}

		/* On rev, from MPI_ANY_SOURCE, completed by MPI_Testall with
		 * statuses. */
		for (int k = 0; k < 5; k++)
			sd[k] = 10 * me + k;
		two[0] = s25;
		two[1] = r25;
		MPI_Startall(2, two);
		flag = 0;
		while (!flag)
			MPI_Testall(2, two, &flag, sts);
		note('S', other, 25, 20);
		note('R', other, 25, 20);
		total += rd[4];

		/* Completed by MPI_Waitsome. */
		se[0] = i;
		two[0] = s26;
		two[1] = r26;
		MPI_Start(&two[1]);
		MPI_Start(&two[0]);
		for (done = 0; done < 2; done += outcount) {
			MPI_Waitsome(2, two, &outcount, indices, sts);
			if (outcount == MPI_UNDEFINED)
				break;
		}
		note('S', other, 26, 4);
		note('R', other, 26, 4);
		total += re[0];

		/* Completed by MPI_Testany. */
		sf[5] = i;
		two[0] = r27;
		two[1] = s27;
		MPI_Startall(2, two);
		for (done = 0; done < 2;) {
			MPI_Testany(2, two, &idx, &flag, MPI_STATUS_IGNORE);
			if (flag && idx == MPI_UNDEFINED)
				break;
			if (flag)
				done++;
		}
		note('S', other, 27, 24);
		note('R', other, 27, 24);
		total += rf[5];

		/* The non-blocking collectives, completed by one MPI_Waitall. */
		MPI_Request coll[10];
		int g[3] = {me, me, me}, gr[6], gv[2] = {me, me}, gvr[3], gvc[2] = {1, 2}, gvd[2] = {0, 1};
		int sc2[4] = {1, 2, 3, 4}, scr[2], scv[4] = {5, 6, 7, 8}, scvr[3], scvc[2] = {3, 1},
		    scvd[2] = {0, 3};
		int agv[2] = {me, me}, agvr[3];
		int a2s[3] = {me, me, me}, a2sc[2] = {1, 2}, a2sd[2] = {0, 1}, a2r[4], a2rc[2], a2rd[2];
		int rss[3] = {1, 2, 3}, rsr[2], rsc[2] = {1, 2};
		double rbs[4] = {1, 2, 3, 4}, rbr[2];
		int scs[3] = {me, me, me}, scn[3];
		double exs[2] = {me, me}, exr[2] = {0, 0};
		a2rc[0] = a2rc[1] = me + 1;
		a2rd[0] = 0;
		a2rd[1] = me + 1;
		MPI_Igather(g, 3, MPI_INT, gr, 3, MPI_INT, 0, MPI_COMM_WORLD, &coll[0]);
		note('S', 0, COLL, 12);
		if (me == 0)
			note('R', 0, COLL, 24);
		MPI_Igatherv(gv, me + 1, MPI_INT, gvr, gvc, gvd, MPI_INT, 1, MPI_COMM_WORLD, &coll[1]);
		note('S', 1, COLL, 4 * (me + 1));
		if (me == 1)
			note('R', 1, COLL, 12);
		MPI_Iscatter(sc2, 2, MPI_INT, scr, 2, MPI_INT, 0, MPI_COMM_WORLD, &coll[2]);
		if (me == 0)
			note('S', 0, COLL, 16);
		note('R', 0, COLL, 8);
		MPI_Iscatterv(scv, scvc, scvd, MPI_INT, scvr, scvc[me], MPI_INT, 1, MPI_COMM_WORLD, &coll[3]);
		if (me == 1)
			note('S', 1, COLL, 16);
		note('R', 1, COLL, 4 * scvc[me]);
		MPI_Iallgatherv(agv, me + 1, MPI_INT, agvr, gvc, gvd, MPI_INT, MPI_COMM_WORLD, &coll[4]);
		note('S', me, COLL, 4 * (me + 1));
		note('R', me, COLL, 12);
		MPI_Ialltoallv(a2s, a2sc, a2sd, MPI_INT, a2r, a2rc, a2rd, MPI_INT, MPI_COMM_WORLD, &coll[5]);
		note('S', me, COLL, 12);
		note('R', me, COLL, 8 * (me + 1));
		MPI_Ireduce_scatter(rss, rsr, rsc, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &coll[6]);
		note('S', me, COLL, 12);
		note('R', me, COLL, 4 * rsc[me]);
		MPI_Ireduce_scatter_block(rbs, rbr, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &coll[7]);
		note('S', me, COLL, 32);
		note('R', me, COLL, 16);
		MPI_Iscan(scs, scn, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &coll[8]);
		note('S', me, COLL, 12);
		note('R', me, COLL, 12);
		MPI_Iexscan(exs, exr, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &coll[9]);
		note('S', me, COLL, 16);
		if (me != 0)
			note('R', me, COLL, 16);
		MPI_Waitall(10, coll, MPI_STATUSES_IGNORE);
		total += scr[1] + scvr[0] + agvr[2] + a2r[0] + rsr[0] + (long)rbr[1] + scn[2];
		if (me == 0)
			total += gr[5];
		else
			total += gvr[2] + (long)exr[1];
	}

	MPI_Request *all[] = {&s21, &r21, &s22, &r22, &s23, &r23, &s24, &r24, &s25, &r25, &s26, &r26,
	                      &s27, &r27};
	for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
		if (*all[k] != MPI_REQUEST_NULL)
			MPI_Request_free(all[k]);
	MPI_Comm_free(&rev);
	void *detached;
	int size;
	MPI_Buffer_detach(&detached, &size);
	write_notes(dir, me);
	printf("rank %d checksum %ld\n", me, total);
	MPI_Finalize();
	return 0;
}
