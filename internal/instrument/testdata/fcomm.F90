! fcomm.F90: a Fortran MPI program that moves data every way the event
! library records, and writes down each message it moves. Built three times:
! with -DMPIF_H (include 'mpif.h'), without (use mpi), and with -DF08
! (use mpi_f08). On 3 or more ranks, N times (the first argument, default
! 20), it exchanges messages around the ring with blocking, synchronous,
! ready, buffered and non-blocking sends, receives completed by MPI_Recv,
! MPI_Sendrecv, MPI_Sendrecv_replace and every MPI_Wait and MPI_Test
! function, with statuses and with MPI_STATUS(ES)_IGNORE, and calls each
! collective the library records, twice with MPI_IN_PLACE.
!
! Every message it sends or receives, and each collective's part, it notes
! as the library records it (partner: a rank of MPI_COMM_WORLD, the
! collective's root or itself; tag: -1 for a collective; bytes), and it
! writes the counts to DIR/expect.RANK (DIR the second argument):
!
!   S 1 11 16 20
!
! kind (S send, R receive), partner, tag, bytes, messages. It prints its
! rank and a checksum of what it received.
module fcomm_notes
  implicit none
  integer, parameter :: maxnotes = 128
  character :: kinds(maxnotes)
  integer :: partners(maxnotes), tags(maxnotes), nbytes(maxnotes), nmsgs(maxnotes)
  integer :: nnotes = 0
contains
  ! note counts one message: kind 'S' or 'R', partner, tag, bytes.
  subroutine note(kind, partner, tag, bytes)
    character, intent(in) :: kind
    integer, intent(in) :: partner, tag, bytes
    integer :: i
    do i = 1, nnotes
      if (kinds(i) == kind .and. partners(i) == partner .and. tags(i) == tag .and. nbytes(i) == bytes) then
        nmsgs(i) = nmsgs(i) + 1
        return
      end if
    end do
    nnotes = nnotes + 1
    kinds(nnotes) = kind
    partners(nnotes) = partner
    tags(nnotes) = tag
    nbytes(nnotes) = bytes
    nmsgs(nnotes) = 1
  end subroutine note

  subroutine write_notes(dir, rank)
    character(len=*), intent(in) :: dir
    integer, intent(in) :: rank
    character(len=512) :: path
    integer :: i
    write (path, '(a,a,i0)') trim(dir), '/expect.', rank
    open (unit=10, file=trim(path), status='replace', action='write')
    do i = 1, nnotes
      write (10, '(a,1x,i0,1x,i0,1x,i0,1x,i0)') kinds(i), partners(i), tags(i), nbytes(i), nmsgs(i)
    end do
    close (10)
  end subroutine write_notes
end module fcomm_notes

program fcomm
#ifdef F08
  use mpi_f08
  use, intrinsic :: iso_c_binding, only: c_ptr
#elif !defined(MPIF_H)
  use mpi
#endif
  use fcomm_notes
  implicit none
#ifdef MPIF_H
  include 'mpif.h'
#endif
#ifdef F08
  type(c_ptr) :: detached
  type(MPI_Status) :: st, sts(2)
  type(MPI_Request) :: reqs(2), req
#else
  integer :: st(MPI_STATUS_SIZE), sts(MPI_STATUS_SIZE, 2)
  integer :: reqs(2), req
#endif
  integer, parameter :: coll = -1, maxp = 16
  integer :: ierr, me, np, next, prev, i, k, n, idx, outcount, indices(2), done
  logical :: flag
  integer :: ia(8), ib(8), ic(maxp * maxp), id(maxp * maxp), counts(maxp), displs(maxp)
  integer :: rcounts(maxp), rdispls(maxp), total
  double precision :: da(8), db(8), dc(maxp * maxp), dd(maxp * maxp)
  integer :: bsendbuf(4096)
  character(len=256) :: arg, dir
  n = 20
  dir = '.'
  if (command_argument_count() > 0) then
    call get_command_argument(1, arg)
    read (arg, *) n
  end if
  if (command_argument_count() > 1) call get_command_argument(2, dir)

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, me, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, np, ierr)
  if (np < 3 .or. np > maxp) then
    print '(a)', 'fcomm: run on 3 to 16 ranks'
    call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  next = mod(me + 1, np)
  prev = mod(me + np - 1, np)
  call MPI_Buffer_attach(bsendbuf, 4 * size(bsendbuf), ierr)
  total = 0

  do i = 1, n
    ! Blocking send and receive with a status.
    ia = me + i
    call MPI_Send(ia, 4, MPI_INTEGER, next, 11, MPI_COMM_WORLD, ierr)
    call note('S', next, 11, 16)
    call MPI_Recv(ib, 4, MPI_INTEGER, prev, 11, MPI_COMM_WORLD, st, ierr)
    call note('R', prev, 11, 16)
    total = total + ib(1)

    ! Non-blocking both ways, completed by MPI_Waitall with statuses.
    da = me
    call MPI_Isend(da, 8, MPI_DOUBLE_PRECISION, prev, 12, MPI_COMM_WORLD, reqs(1), ierr)
    call note('S', prev, 12, 64)
    call MPI_Irecv(db, 8, MPI_DOUBLE_PRECISION, next, 12, MPI_COMM_WORLD, reqs(2), ierr)
    call note('R', next, 12, 64)
    call MPI_Waitall(2, reqs, sts, ierr)
    total = total + int(db(8))

    ! A receive from any source, completed by MPI_Wait without a status.
    call MPI_Irecv(ib, 3, MPI_INTEGER, MPI_ANY_SOURCE, 13, MPI_COMM_WORLD, req, ierr)
    call note('R', prev, 13, 12)
    call MPI_Send(ia, 3, MPI_INTEGER, next, 13, MPI_COMM_WORLD, ierr)
    call note('S', next, 13, 12)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)

    ! MPI_Sendrecv without a status, MPI_Sendrecv_replace with one.
    call MPI_Sendrecv(ia, 2, MPI_INTEGER, next, 14, ib, 2, MPI_INTEGER, prev, 14, &
                      MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
    call note('S', next, 14, 8)
    call note('R', prev, 14, 8)
    da = me + i
    call MPI_Sendrecv_replace(da, 5, MPI_DOUBLE_PRECISION, next, 15, prev, 15, &
                              MPI_COMM_WORLD, st, ierr)
    call note('S', next, 15, 40)
    call note('R', prev, 15, 40)

    ! Two receives completed one at a time by MPI_Waitany; the sends by
    ! MPI_Waitall without statuses.
    call MPI_Irecv(ib(1), 1, MPI_INTEGER, prev, 16, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Irecv(ib(3), 2, MPI_INTEGER, prev, 17, MPI_COMM_WORLD, reqs(2), ierr)
    call note('R', prev, 16, 4)
    call note('R', prev, 17, 8)
    call MPI_Send(ia, 2, MPI_INTEGER, next, 17, MPI_COMM_WORLD, ierr)
    call MPI_Send(ia, 1, MPI_INTEGER, next, 16, MPI_COMM_WORLD, ierr)
    call note('S', next, 17, 8)
    call note('S', next, 16, 4)
    call MPI_Waitany(2, reqs, idx, st, ierr)
    call MPI_Waitany(2, reqs, idx, MPI_STATUS_IGNORE, ierr)

    ! MPI_Test until done, with a status.
    call MPI_Irecv(db, 1, MPI_DOUBLE_PRECISION, prev, 18, MPI_COMM_WORLD, req, ierr)
    call note('R', prev, 18, 8)
    call MPI_Send(da, 1, MPI_DOUBLE_PRECISION, next, 18, MPI_COMM_WORLD, ierr)
    call note('S', next, 18, 8)
    call test_loop(1)

    ! MPI_Waitsome without statuses, over a receive and a send.
    call MPI_Irecv(ib, 6, MPI_INTEGER, prev, 19, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Isend(ia, 6, MPI_INTEGER, next, 19, MPI_COMM_WORLD, reqs(2), ierr)
    call note('R', prev, 19, 24)
    call note('S', next, 19, 24)
    done = 0
    do while (done < 2)
      call MPI_Waitsome(2, reqs, outcount, indices, MPI_STATUSES_IGNORE, ierr)
      if (outcount /= MPI_UNDEFINED) done = done + outcount
    end do

    ! MPI_Testany, MPI_Testall (without statuses), MPI_Testsome (with).
    call MPI_Irecv(ib, 7, MPI_INTEGER, prev, 20, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Isend(ia, 7, MPI_INTEGER, next, 20, MPI_COMM_WORLD, reqs(2), ierr)
    call note('R', prev, 20, 28)
    call note('S', next, 20, 28)
    call test_loop(2)
    call MPI_Irecv(ib, 5, MPI_INTEGER, prev, 21, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Isend(ia, 5, MPI_INTEGER, next, 21, MPI_COMM_WORLD, reqs(2), ierr)
    call note('R', prev, 21, 20)
    call note('S', next, 21, 20)
    call test_loop(3)
    call MPI_Irecv(db, 3, MPI_DOUBLE_PRECISION, prev, 22, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Isend(da, 3, MPI_DOUBLE_PRECISION, next, 22, MPI_COMM_WORLD, reqs(2), ierr)
    call note('R', prev, 22, 24)
    call note('S', next, 22, 24)
    call test_loop(4)

    ! Synchronous, ready and buffered sends, from rank 0 to ranks 1 and 2.
    if (me == 1) then
      call MPI_Irecv(ib, 2, MPI_INTEGER, 0, 24, MPI_COMM_WORLD, req, ierr)
      call note('R', 0, 24, 8)
    end if
    call MPI_Barrier(MPI_COMM_WORLD, ierr)
    if (me == 0) then
      call MPI_Ssend(ia, 3, MPI_INTEGER, 1, 23, MPI_COMM_WORLD, ierr)
      call note('S', 1, 23, 12)
      call MPI_Rsend(ia, 2, MPI_INTEGER, 1, 24, MPI_COMM_WORLD, ierr)
      call note('S', 1, 24, 8)
      call MPI_Bsend(da, 2, MPI_DOUBLE_PRECISION, 2, 25, MPI_COMM_WORLD, ierr)
      call note('S', 2, 25, 16)
    else if (me == 1) then
      call MPI_Recv(ic, 3, MPI_INTEGER, 0, 23, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
      call note('R', 0, 23, 12)
      call MPI_Wait(req, st, ierr)
    else if (me == 2) then
      call MPI_Recv(db, 2, MPI_DOUBLE_PRECISION, 0, 25, MPI_COMM_WORLD, st, ierr)
      call note('R', 0, 25, 16)
    end if

    ! Collectives.
    call MPI_Bcast(ia, 3, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    call note_rooted(0, merge(12, 0, me == 0), merge(0, 12, me == 0))
    call MPI_Reduce(da, db, 2, MPI_DOUBLE_PRECISION, MPI_SUM, 1, MPI_COMM_WORLD, ierr)
    call note_rooted(1, 16, merge(16, 0, me == 1))
    call MPI_Allreduce(da, db, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    call note_self(8, 8)
    call MPI_Gather(ia, 2, MPI_INTEGER, ic, 2, MPI_INTEGER, 2, MPI_COMM_WORLD, ierr)
    call note_rooted(2, 8, merge(8 * np, 0, me == 2))
    ! In place at the root, which sends nothing of its own arguments.
    if (me == 1) then
      call MPI_Gather(MPI_IN_PLACE, 0, MPI_INTEGER, ic, 3, MPI_INTEGER, 1, MPI_COMM_WORLD, ierr)
    else
      call MPI_Gather(ia, 3, MPI_INTEGER, ic, 3, MPI_INTEGER, 1, MPI_COMM_WORLD, ierr)
    end if
    call note_rooted(1, 12, merge(12 * np, 0, me == 1))
    do k = 1, np
      counts(k) = k
      displs(k) = (k - 1) * np
    end do
    call MPI_Gatherv(ia, me + 1, MPI_INTEGER, ic, counts, displs, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    call note_rooted(0, 4 * (me + 1), merge(4 * np * (np + 1) / 2, 0, me == 0))
    call MPI_Scatter(ic, 2, MPI_INTEGER, ib, 2, MPI_INTEGER, 1, MPI_COMM_WORLD, ierr)
    call note_rooted(1, merge(8 * np, 0, me == 1), 8)
    call MPI_Scatterv(ic, counts, displs, MPI_INTEGER, ib, me + 1, MPI_INTEGER, 2, MPI_COMM_WORLD, ierr)
    call note_rooted(2, merge(4 * np * (np + 1) / 2, 0, me == 2), 4 * (me + 1))
    call MPI_Allgather(ia, 1, MPI_INTEGER, ic, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call note_self(4, 4 * np)
    ic(me + 1) = me
    call MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ic, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call note_self(4, 4 * np)
    total = total + sum(ic(1:np))
    call MPI_Allgatherv(ia, me + 1, MPI_INTEGER, ic, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call note_self(4 * (me + 1), 4 * np * (np + 1) / 2)
    call MPI_Alltoall(ia, 1, MPI_INTEGER, ic, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call note_self(4 * np, 4 * np)
    do k = 1, np
      rcounts(k) = me + 1
      rdispls(k) = (k - 1) * np
    end do
    call MPI_Alltoallv(ic, counts, displs, MPI_INTEGER, id, rcounts, rdispls, MPI_INTEGER, &
                       MPI_COMM_WORLD, ierr)
    call note_self(4 * np * (np + 1) / 2, 4 * np * (me + 1))
    dc = me
    call MPI_Reduce_scatter(dc, dd, counts, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    call note_self(8 * np * (np + 1) / 2, 8 * (me + 1))
    total = total + int(dd(1))
  end do

#ifdef F08
  call MPI_Buffer_detach(detached, k, ierr)
#else
  call MPI_Buffer_detach(bsendbuf, k, ierr)
#endif
  call write_notes(trim(dir), me)
  print '(a,i0,a,i0)', 'rank ', me, ' checksum ', total
  call MPI_Finalize(ierr)

contains
  ! test_loop completes reqs (req for 1) with MPI_Test (1), MPI_Testany
  ! (2), MPI_Testall without statuses (3) or MPI_Testsome (4).
  subroutine test_loop(how)
    integer, intent(in) :: how
    integer :: left
    left = 2
    if (how == 1) left = 1
    do while (left > 0)
      select case (how)
      case (1)
        call MPI_Test(req, flag, st, ierr)
        if (flag) left = 0
      case (2)
        call MPI_Testany(2, reqs, idx, flag, st, ierr)
        if (flag .and. idx /= MPI_UNDEFINED) left = left - 1
        if (flag .and. idx == MPI_UNDEFINED) left = 0
      case (3)
        call MPI_Testall(2, reqs, flag, MPI_STATUSES_IGNORE, ierr)
        if (flag) left = 0
      case (4)
        call MPI_Testsome(2, reqs, outcount, indices, sts, ierr)
        if (outcount == MPI_UNDEFINED) then
          left = 0
        else
          left = left - outcount
        end if
      end select
    end do
  end subroutine test_loop

  ! note_rooted notes a rooted collective's part: sent bytes to the root,
  ! got bytes from it (the root's partner is itself); zero notes nothing.
  subroutine note_rooted(root, sent, got)
    integer, intent(in) :: root, sent, got
    if (sent > 0) call note('S', root, coll, sent)
    if (got > 0) call note('R', root, coll, got)
  end subroutine note_rooted

  ! note_self notes a collective without a root.
  subroutine note_self(sent, got)
    integer, intent(in) :: sent, got
    call note_rooted(me, sent, got)
  end subroutine note_self
end program fcomm
