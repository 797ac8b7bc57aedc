! fring08.f90: a Fortran ring through "use mpi_f08". Each rank passes a buffer
! around the ring with MPI_Sendrecv_replace and sums a value with
! MPI_Allreduce, N times each (N from the first argument, default 1000),
! after one MPI_Get_version; it prints its rank and the final sum.
program fring08
  use mpi_f08
  implicit none
  integer :: ierr, rank, nprocs, i, n, next, prev, ver, subver
  type(MPI_Status) :: status
  character(len=16) :: arg
  double precision :: buf(8), s, total
  n = 1000
  if (command_argument_count() > 0) then
    call get_command_argument(1, arg)
    read (arg, *) n
  end if
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)
  call MPI_Get_version(ver, subver, ierr)
  next = mod(rank + 1, nprocs)
  prev = mod(rank + nprocs - 1, nprocs)
  buf = rank
  total = 0
  do i = 1, n
    call MPI_Sendrecv_replace(buf, 8, MPI_DOUBLE_PRECISION, next, 3, prev, 3, &
                              MPI_COMM_WORLD, status, ierr)
    s = buf(1)
    call MPI_Allreduce(s, total, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  end do
  print '(a,i0,a,f0.1)', 'rank ', rank, ' total ', total
  call MPI_Finalize(ierr)
end program fring08
