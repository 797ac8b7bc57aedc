package workload

// The simulated application is a molecular-dynamics-like MPI+OpenMP(+CUDA)
// code. Thread 0 of every rank runs main: MPI_Init and setup, then timesteps
// (forces, halo exchange with rank±1, integration, an allreduce, optionally
// GPU offload) with a periodic io_write, then finalize. The other CPU threads
// are OpenMP workers running parallel regions over the same force kernels.
// Function ids are the positions in funcTable and are the same on every rank.

// Function ids.
const (
	fMain uint32 = iota
	fMPIInit
	fSetup
	fReadInput
	fTimestep
	fComputeForces
	fBuildNeighborList
	fBinAtoms
	fPairForces
	fLJKernel
	fCoulombReal
	fEwaldSum
	fErfcApprox
	fBondedForces
	fBondKernel
	fAngleKernel
	fDihedralKernel
	fPMELongRange
	fFFTForward
	fFFTBackward
	fHaloExchange
	fPackBuffer
	fUnpackBuffer
	fMPIIrecv
	fMPIIsend
	fMPIWaitall
	fIntegrate
	fUpdatePositions
	fApplyConstraints
	fMPIAllreduce
	fComputeEnergy
	fMPIReduce
	fIOWrite
	fH5Dwrite
	fMPIFileWriteAtAll
	fFinalize
	fMPIFinalize
	fGPUOffload
	fCudaLaunchKernel
	fCudaStreamSynchronize
	fNonbondedKernel
	fPMESpreadKernel
	fIntegrateKernel
	fWorkerMain
	fOMPParallelRegion
	fOMPForLoop
	fComputeChunk
	fVecReduce
	fOMPBarrier
	fMigrateAtoms
	fMPISend
	fMPIRecv
	numFuncs
)

// Counter ids.
const (
	cTotIns uint32 = iota
	cL2TCM
	cAllreduceBytes
	cCorrelation
	numCounters
)

// CorrelationCounter is the name of the counter that carries the CUDA
// correlation id, on the CPU launch (inside cudaLaunchKernel) and on the GPU
// kernel (at the kernel's entry, on the GPU thread).
const CorrelationCounter = "Correlation ID"

var counterNames = [numCounters]string{
	cTotIns:         "PAPI_TOT_INS",
	cL2TCM:          "PAPI_L2_TCM",
	cAllreduceBytes: "Message size for all-reduce",
	cCorrelation:    CorrelationCounter,
}

// commRole says which point-to-point events a function emits.
type commRole uint8

const (
	commNone     commRole = iota
	commHaloSend          // MPI_Isend: one send, to rank-1 then rank+1 (by call ordinal)
	commHaloRecv          // MPI_Waitall: two receives, from rank-1 and rank+1
	commRandSend          // MPI_Send: one send to a random other rank
	commRandRecv          // MPI_Recv: one receive from a random other rank
)

// Message tags.
const (
	tagHaloLeft  = 100 // sent to rank-1
	tagHaloRight = 101 // sent to rank+1
	tagMigrate   = 200
)

// child is one entry of a function's child list: the callee is called a
// uniform number of times in [min, max], or not at all with probability
// 1-prob (prob 0 means always).
type child struct {
	fid      uint32
	min, max uint32
	prob     float64
	gpuOnly  bool
}

// funcDef is the generator's view of one function.
type funcDef struct {
	name     string
	group    string
	modes    []Mode
	kind     Kind // the anomaly kind that may hit this function; "" for none
	gpu      bool
	children []child
	counters []uint32 // counters sampled inside each execution
	comm     commRole
	launch   bool // cudaLaunchKernel: launches a kernel and emits the correlation id
}

func m(w, mean, sd float64) Mode { return Mode{Weight: w, Mean: mean, StdDev: sd} }

func one(mean, sd float64) []Mode { return []Mode{m(1, mean, sd)} }

func always(fid uint32, n uint32) child       { return child{fid: fid, min: n, max: n} }
func between(fid uint32, lo, hi uint32) child { return child{fid: fid, min: lo, max: hi} }
func maybe(fid uint32, p float64) child       { return child{fid: fid, min: 1, max: 1, prob: p} }

// funcTable defines every function: its exclusive-runtime distribution in
// microseconds (one to three modes, each a bounded bell curve of +-3 standard
// deviations), its children and what it emits. Modes of a multimodal function
// are separated by many standard deviations, like the branches of real code.
var funcTable = [numFuncs]funcDef{
	fMain:    {name: "main", group: "TAU_DEFAULT", modes: one(4, 0.5), children: nil},
	fMPIInit: {name: "MPI_Init", group: "MPI", modes: one(15000, 800)},
	fSetup: {name: "setup", group: "TAU_USER", modes: one(3000, 150),
		children: []child{always(fReadInput, 1), always(fBuildNeighborList, 1)}},
	fReadInput: {name: "read_input", group: "IO", modes: one(8000, 400)},
	fTimestep: {name: "timestep", group: "TAU_USER", modes: one(30, 1.5), kind: SlowCall,
		children: []child{
			always(fComputeForces, 1),
			always(fHaloExchange, 1),
			always(fIntegrate, 1),
			{fid: fGPUOffload, min: 1, max: 1, gpuOnly: true},
			always(fMPIAllreduce, 1),
			maybe(fComputeEnergy, 0.1),
			maybe(fMigrateAtoms, 0.05),
		}},
	fComputeForces: {name: "compute_forces", group: "TAU_USER", modes: one(40, 2), kind: SlowCall,
		children: []child{maybe(fBuildNeighborList, 0.1), always(fPairForces, 1), always(fBondedForces, 1), always(fPMELongRange, 1)}},
	fBuildNeighborList: {name: "build_neighbor_list", group: "TAU_USER", modes: []Mode{m(0.7, 400, 15), m(0.3, 900, 30)}, kind: SlowCall,
		children: []child{always(fBinAtoms, 1)}},
	fBinAtoms: {name: "bin_atoms", group: "TAU_USER", modes: one(150, 7), kind: SlowCall, counters: []uint32{cTotIns, cL2TCM}},
	fPairForces: {name: "pair_forces", group: "TAU_USER", modes: one(40, 2), kind: SlowCall,
		children: []child{between(fLJKernel, 4, 8), between(fCoulombReal, 2, 4)}},
	fLJKernel: {name: "lj_kernel", group: "TAU_USER", modes: one(25, 1.2), kind: SlowCall, counters: []uint32{cTotIns, cL2TCM}},
	fCoulombReal: {name: "coulomb_real", group: "TAU_USER", modes: one(20, 1), kind: SlowCall,
		children: []child{between(fEwaldSum, 1, 2)}},
	fEwaldSum: {name: "ewald_sum", group: "TAU_USER", modes: one(18, 1), kind: SlowCall,
		children: []child{between(fErfcApprox, 2, 3)}},
	fErfcApprox: {name: "erfc_approx", group: "TAU_USER", modes: one(12, 0.6), kind: SlowCall, counters: []uint32{cTotIns}},
	fBondedForces: {name: "bonded_forces", group: "TAU_USER", modes: []Mode{m(0.5, 60, 2.5), m(0.35, 140, 5), m(0.15, 260, 9)}, kind: SlowCall,
		children: []child{always(fBondKernel, 1), always(fAngleKernel, 1), maybe(fDihedralKernel, 0.5)}},
	fBondKernel:     {name: "bond_kernel", group: "TAU_USER", modes: one(35, 1.8), kind: SlowCall, counters: []uint32{cTotIns, cL2TCM}},
	fAngleKernel:    {name: "angle_kernel", group: "TAU_USER", modes: one(45, 2.2), kind: SlowCall, counters: []uint32{cTotIns, cL2TCM}},
	fDihedralKernel: {name: "dihedral_kernel", group: "TAU_USER", modes: one(80, 3), kind: FastOutlier, counters: []uint32{cTotIns, cL2TCM}},
	fPMELongRange: {name: "pme_long_range", group: "TAU_USER", modes: one(200, 10), kind: SlowCall,
		children: []child{always(fFFTForward, 1), always(fFFTBackward, 1)}},
	fFFTForward:  {name: "fft_forward", group: "TAU_USER", modes: one(250, 10), kind: SlowRank, counters: []uint32{cTotIns, cL2TCM}},
	fFFTBackward: {name: "fft_backward", group: "TAU_USER", modes: one(250, 10), kind: SlowRank, counters: []uint32{cTotIns, cL2TCM}},
	fHaloExchange: {name: "halo_exchange", group: "TAU_USER", modes: one(40, 2), kind: SlowCall,
		children: []child{always(fPackBuffer, 2), always(fMPIIrecv, 2), always(fMPIIsend, 2), always(fMPIWaitall, 1), always(fUnpackBuffer, 2)}},
	fPackBuffer:   {name: "pack_buffer", group: "TAU_USER", modes: one(30, 1.5), kind: SlowBurst},
	fUnpackBuffer: {name: "unpack_buffer", group: "TAU_USER", modes: one(30, 1.5), kind: SlowBurst},
	fMPIIrecv:     {name: "MPI_Irecv", group: "MPI", modes: one(6, 0.4), kind: SlowCall},
	fMPIIsend:     {name: "MPI_Isend", group: "MPI", modes: one(8, 0.5), kind: SlowCall, comm: commHaloSend},
	fMPIWaitall:   {name: "MPI_Waitall", group: "MPI", modes: []Mode{m(0.8, 40, 2), m(0.2, 180, 8)}, kind: SlowCall, comm: commHaloRecv},
	fIntegrate: {name: "integrate", group: "TAU_USER", modes: one(20, 1), kind: SlowCall,
		children: []child{always(fUpdatePositions, 1), always(fApplyConstraints, 1)}},
	fUpdatePositions:  {name: "update_positions", group: "TAU_USER", modes: one(90, 3), kind: FastOutlier, counters: []uint32{cTotIns, cL2TCM}},
	fApplyConstraints: {name: "apply_constraints", group: "TAU_USER", modes: []Mode{m(0.6, 50, 2), m(0.3, 110, 4), m(0.1, 240, 9)}, kind: SlowCall},
	fMPIAllreduce: {name: "MPI_Allreduce", group: "MPI", modes: []Mode{m(0.85, 25, 1.2), m(0.15, 90, 4)}, kind: SlowCall,
		counters: []uint32{cAllreduceBytes}},
	fComputeEnergy: {name: "compute_energy", group: "TAU_USER", modes: one(120, 5), kind: SlowCall,
		children: []child{always(fMPIReduce, 1)}},
	fMPIReduce: {name: "MPI_Reduce", group: "MPI", modes: one(30, 1.5), kind: SlowCall},
	fIOWrite: {name: "io_write", group: "IO", modes: one(2000, 80),
		children: []child{always(fH5Dwrite, 1)}},
	fH5Dwrite: {name: "H5Dwrite", group: "IO", modes: []Mode{m(0.7, 1500, 50), m(0.3, 4000, 120)},
		children: []child{always(fMPIFileWriteAtAll, 1)}},
	fMPIFileWriteAtAll: {name: "MPI_File_write_at_all", group: "MPI", modes: one(3000, 120)},
	fFinalize: {name: "finalize", group: "TAU_USER", modes: one(500, 25),
		children: []child{always(fMPIFinalize, 1)}},
	fMPIFinalize: {name: "MPI_Finalize", group: "MPI", modes: one(8000, 400)},
	fGPUOffload: {name: "gpu_offload", group: "TAU_USER", modes: one(20, 1), kind: SlowCall,
		children: []child{between(fCudaLaunchKernel, 2, 3), always(fCudaStreamSynchronize, 1)}},
	fCudaLaunchKernel:      {name: "cudaLaunchKernel", group: "CUDA", modes: one(7, 0.4), kind: SlowCall, launch: true},
	fCudaStreamSynchronize: {name: "cudaStreamSynchronize", group: "CUDA", modes: []Mode{m(0.7, 20, 1), m(0.3, 150, 6)}, kind: SlowCall},
	fNonbondedKernel:       {name: "nonbonded_kernel", group: "CUDA", modes: one(300, 12), kind: SlowKernel, gpu: true},
	fPMESpreadKernel:       {name: "pme_spread_kernel", group: "CUDA", modes: []Mode{m(0.6, 120, 5), m(0.4, 260, 10)}, kind: SlowKernel, gpu: true},
	fIntegrateKernel:       {name: "integrate_kernel", group: "CUDA", modes: one(60, 2.5), kind: SlowKernel, gpu: true},
	fWorkerMain:            {name: "worker_main", group: "OpenMP", modes: one(4, 0.5)},
	fOMPParallelRegion: {name: "omp_parallel_region", group: "OpenMP", modes: one(10, 0.6), kind: SlowCall,
		children: []child{always(fOMPForLoop, 1), always(fOMPBarrier, 1)}},
	fOMPForLoop: {name: "omp_for_loop", group: "OpenMP", modes: one(20, 1), kind: SlowCall,
		children: []child{between(fPairForces, 1, 2), between(fComputeChunk, 1, 3)}},
	fComputeChunk: {name: "compute_chunk", group: "TAU_USER", modes: []Mode{m(0.5, 70, 3), m(0.5, 160, 6)}, kind: SlowCall,
		counters: []uint32{cTotIns, cL2TCM}, children: []child{always(fVecReduce, 1)}},
	fVecReduce:  {name: "vec_reduce", group: "TAU_USER", modes: one(22, 1.1), kind: SlowCall, counters: []uint32{cTotIns}},
	fOMPBarrier: {name: "omp_barrier", group: "OpenMP", modes: []Mode{m(0.7, 15, 0.8), m(0.3, 60, 2.5)}, kind: SlowCall},
	fMigrateAtoms: {name: "migrate_atoms", group: "TAU_USER", modes: one(80, 4), kind: SlowCall,
		children: []child{always(fMPISend, 1), always(fMPIRecv, 1)}},
	fMPISend: {name: "MPI_Send", group: "MPI", modes: one(12, 0.6), kind: SlowCall, comm: commRandSend},
	fMPIRecv: {name: "MPI_Recv", group: "MPI", modes: []Mode{m(0.7, 20, 1), m(0.3, 70, 3)}, kind: SlowCall, comm: commRandRecv},
}

// kernelOf maps the ordinal of a cudaLaunchKernel call inside gpu_offload
// to the kernel it launches.
var kernelOf = [...]uint32{fNonbondedKernel, fPMESpreadKernel, fIntegrateKernel}

// threadProgram is what one CPU thread runs: a root function that calls the
// prologue once, the loop body until the run's end, the periodic function
// every period iterations, and the epilogue once.
type threadProgram struct {
	root     uint32
	prologue []uint32
	loop     uint32
	periodic uint32 // noFunc for none
	epilogue []uint32
}

const noFunc = ^uint32(0)

var (
	mainProgram   = threadProgram{root: fMain, prologue: []uint32{fMPIInit, fSetup}, loop: fTimestep, periodic: fIOWrite, epilogue: []uint32{fFinalize}}
	workerProgram = threadProgram{root: fWorkerMain, loop: fOMPParallelRegion, periodic: noFunc}
)

// numGPUStreams is the number of GPU virtual threads per rank when the GPU is
// on; kernel k of a timestep goes to stream k mod numGPUStreams.
const numGPUStreams = 2
