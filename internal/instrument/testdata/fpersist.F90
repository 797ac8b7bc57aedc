! fpersist.F90: persistent requests and non-blocking collectives from
! Fortran, each message noted as the event library records it. Built with
! -DMPIF_H (include 'mpif.h'), without (use mpi), and with -DF08
! (use mpi_f08). On 2 ranks, N times (the first argument, default 20), each
! rank starts persistent sends and receives made once by MPI_Send_init,
! MPI_Ssend_init and MPI_Recv_init, with MPI_Start (6 calls) and
! MPI_Startall (2 calls), completed by MPI_Wait (with a status), MPI_Waitall
! (without), MPI_Test (without), MPI_Waitany (with) and MPI_Testall (with),
! and calls MPI_Igather, MPI_Iallgatherv, MPI_Ialltoallv, MPI_Iscan and
! MPI_Iexscan once, completed by one MPI_Waitall. It frees the persistent
! requests (8) with MPI_Request_free.
!
! It writes the counts of what it moved to DIR/expect.RANK (DIR the second
! argument), one line per kind of message: kind (S or R), partner (a rank
! of MPI_COMM_WORLD), tag (-1 for a collective), bytes, messages. It prints
! its rank and a checksum of what it received.
module fpersist_notes
  implicit none
  integer, parameter :: maxnotes = 32
  character :: kinds(maxnotes)
  integer :: partners(maxnotes), tags(maxnotes), nbytes(maxnotes), nmsgs(maxnotes)
  integer :: nnotes = 0
contains
  ! note counts one message of bytes bytes; zero notes nothing.
  subroutine note(kind, partner, tag, bytes)
    character, intent(in) :: kind
    integer, intent(in) :: partner, tag, bytes
    integer :: i
    if (bytes == 0) return
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
    write (path, '(a,a,i0)') dir, '/expect.', rank
    open (unit=11, file=trim(path), status='replace', action='write')
    do i = 1, nnotes
      write (11, '(a,1x,i0,1x,i0,1x,i0,1x,i0)') kinds(i), partners(i), tags(i), nbytes(i), nmsgs(i)
    end do
    close (11)
  end subroutine write_notes
end module fpersist_notes

program fpersist
#ifdef F08
  use mpi_f08
#elif !defined(MPIF_H)
  use mpi
#endif
  use fpersist_notes
  implicit none
#ifdef MPIF_H
  include 'mpif.h'
#endif
#ifdef F08
  type(MPI_Status) :: st, sts(2)
  type(MPI_Request) :: s1, r1, s2, r2, s3, r3, s4, r4, two(2), one(1), coll(5)
#else
  integer :: st(MPI_STATUS_SIZE), sts(MPI_STATUS_SIZE, 2)
  integer :: s1, r1, s2, r2, s3, r3, s4, r4, two(2), one(1), coll(5)
#endif
  integer, parameter :: c = -1
  integer :: ierr, me, np, other, i, n, idx, total
  logical :: flag
  integer :: sa(4), ra(4), sc(3), rc(3), sd(5), rd(5), g(2), gr(4), av(2), avr(3), cnts(2), dsps(2)
  integer :: a2s(3), a2r(4), a2sc(2), a2sd(2), a2rc(2), a2rd(2), scs(3), scn(3)
  double precision :: sx(2), rx(2), exs(2), exr(2)
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
  if (np /= 2) then
    print '(a)', 'fpersist: run on 2 ranks'
    call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  other = 1 - me
  total = 0
  call MPI_Send_init(sa, 4, MPI_INTEGER, other, 31, MPI_COMM_WORLD, s1, ierr)
  call MPI_Recv_init(ra, 4, MPI_INTEGER, other, 31, MPI_COMM_WORLD, r1, ierr)
  call MPI_Ssend_init(sx, 2, MPI_DOUBLE_PRECISION, other, 32, MPI_COMM_WORLD, s2, ierr)
  call MPI_Recv_init(rx, 2, MPI_DOUBLE_PRECISION, other, 32, MPI_COMM_WORLD, r2, ierr)
  call MPI_Send_init(sc, 3, MPI_INTEGER, other, 33, MPI_COMM_WORLD, s3, ierr)
  call MPI_Recv_init(rc, 3, MPI_INTEGER, other, 33, MPI_COMM_WORLD, r3, ierr)
  call MPI_Send_init(sd, 5, MPI_INTEGER, other, 34, MPI_COMM_WORLD, s4, ierr)
  call MPI_Recv_init(rd, 5, MPI_INTEGER, other, 34, MPI_COMM_WORLD, r4, ierr)

  do i = 1, n
    ! MPI_Start each, the receive completed by MPI_Wait with a status.
    sa = me + i
    call MPI_Start(r1, ierr)
    call MPI_Start(s1, ierr)
    call MPI_Wait(s1, MPI_STATUS_IGNORE, ierr)
    call MPI_Wait(r1, st, ierr)
    call note('S', other, 31, 16)
    call note('R', other, 31, 16)
    total = total + ra(1)

    ! MPI_Startall, completed by MPI_Waitall without statuses.
    sx = me
    two(1) = r2
    two(2) = s2
    call MPI_Startall(2, two, ierr)
    call MPI_Waitall(2, two, MPI_STATUSES_IGNORE, ierr)
    call note('S', other, 32, 16)
    call note('R', other, 32, 16)
    total = total + int(rx(2))

    ! The receive completed by MPI_Test, then by MPI_Waitany.
    sc = i
    call MPI_Start(r3, ierr)
    call MPI_Start(s3, ierr)
    flag = .false.
    do while (.not. flag)
      call MPI_Test(r3, flag, MPI_STATUS_IGNORE, ierr)
    end do
    call MPI_Wait(s3, MPI_STATUS_IGNORE, ierr)
    total = total + rc(3)
    call MPI_Start(r3, ierr)
    call MPI_Start(s3, ierr)
    one(1) = r3
    call MPI_Waitany(1, one, idx, st, ierr)
    call MPI_Wait(s3, MPI_STATUS_IGNORE, ierr)
    call note('S', other, 33, 12)
    call note('R', other, 33, 12)
    call note('S', other, 33, 12)
    call note('R', other, 33, 12)
    total = total + rc(1)

    ! Completed by MPI_Testall with statuses.
    sd = 2 * me
    two(1) = s4
    two(2) = r4
    call MPI_Startall(2, two, ierr)
    flag = .false.
    do while (.not. flag)
      call MPI_Testall(2, two, flag, sts, ierr)
    end do
    call note('S', other, 34, 20)
    call note('R', other, 34, 20)
    total = total + rd(5)

    ! Non-blocking collectives, completed by one MPI_Waitall.
    g = me
    call MPI_Igather(g, 2, MPI_INTEGER, gr, 2, MPI_INTEGER, 0, MPI_COMM_WORLD, coll(1), ierr)
    call note('S', 0, c, 8)
    if (me == 0) call note('R', 0, c, 16)
    av = me
    cnts = (/1, 2/)
    dsps = (/0, 1/)
    call MPI_Iallgatherv(av, me + 1, MPI_INTEGER, avr, cnts, dsps, MPI_INTEGER, MPI_COMM_WORLD, coll(2), ierr)
    call note('S', me, c, 4 * (me + 1))
    call note('R', me, c, 12)
    a2s = me
    a2sc = (/1, 2/)
    a2sd = (/0, 1/)
    a2rc = me + 1
    a2rd = (/0, me + 1/)
    call MPI_Ialltoallv(a2s, a2sc, a2sd, MPI_INTEGER, a2r, a2rc, a2rd, MPI_INTEGER, MPI_COMM_WORLD, &
                        coll(3), ierr)
    call note('S', me, c, 12)
    call note('R', me, c, 8 * (me + 1))
    scs = me
    call MPI_Iscan(scs, scn, 3, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, coll(4), ierr)
    call note('S', me, c, 12)
    call note('R', me, c, 12)
    exs = me
    call MPI_Iexscan(exs, exr, 2, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, coll(5), ierr)
    call note('S', me, c, 16)
    if (me /= 0) call note('R', me, c, 16)
    call MPI_Waitall(5, coll, MPI_STATUSES_IGNORE, ierr)
    total = total + avr(3) + a2r(1) + scn(3)
  end do

  call MPI_Request_free(s1, ierr)
  call MPI_Request_free(r1, ierr)
  call MPI_Request_free(s2, ierr)
  call MPI_Request_free(r2, ierr)
  call MPI_Request_free(s3, ierr)
  call MPI_Request_free(r3, ierr)
  call MPI_Request_free(s4, ierr)
  call MPI_Request_free(r4, ierr)
  call write_notes(trim(dir), me)
  print '(a,i0,a,i0)', 'rank ', me, ' checksum ', total
  call MPI_Finalize(ierr)
end program fpersist
