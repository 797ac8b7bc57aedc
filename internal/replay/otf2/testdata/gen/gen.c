/*
 * gen writes an OTF2 archive with OTF2's own writer, for the reader's tests:
 *
 *   gen DIR RANKS THREADS ITERATIONS
 *
 * writes DIR/traces.otf2, DIR/traces.def and DIR/traces/<location>.{def,evt}.
 * Rank r's location of thread t has id (t << 32) | r. Rank 0 also has an
 * accelerator location group (created by rank 0) with one GPU stream.
 * Thread 0 of every rank, per iteration: compute (with a metric event of
 * three members: PAPI_TOT_CYC uint64, energy double, delta int64 that is
 * negative every fifth iteration), MPI_Send to the next rank on
 * MPI_COMM_WORLD, MPI_Irecv from the previous rank on "reversed" (a
 * communicator whose ranks are MPI_COMM_WORLD's in reverse order), and a
 * collective (begin/end events, which frames do not hold). Other threads
 * run compute with the metric; the GPU stream runs kernels. Rank 1 also has
 * a metric location recording "node power" (a metric instance of an abstract
 * metric class, scope: rank 1's location group). Rank 1 thread 0
 * has two clock offsets (its clock drifts); rank 2 thread 0 writes its
 * regions with local ids and a mapping table.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <otf2/otf2.h>

#define RES 2400000000ULL /* ticks per second */
#define OFFSET 1000000000000ULL
#define STEP 240000ULL /* ticks per iteration: 100 µs */

enum { R_MAIN, R_COMPUTE, R_SEND, R_IRECV, R_BARRIER, R_KERNEL, NREGIONS };
static const char* region_names[ NREGIONS ] = { "main", "compute", "MPI_Send", "MPI_Irecv", "MPI_Barrier", "kernel" };

static OTF2_FlushType
pre_flush( void* userData, OTF2_FileType fileType, OTF2_LocationRef location, void* callerData, bool final )
{
    return OTF2_FLUSH;
}

static OTF2_TimeStamp
post_flush( void* userData, OTF2_FileType fileType, OTF2_LocationRef location )
{
    return 0;
}

static OTF2_FlushCallbacks flush_callbacks = { .otf2_pre_flush = pre_flush, .otf2_post_flush = post_flush };

static void
check( OTF2_ErrorCode err, const char* what )
{
    if ( err != OTF2_SUCCESS )
    {
        fprintf( stderr, "gen: %s: %s\n", what, OTF2_Error_GetName( err ) );
        exit( 1 );
    }
}

static uint64_t
loc_id( uint32_t rank, uint32_t thread )
{
    return ( ( uint64_t )thread << 32 ) | rank;
}

/* local region id of a region on rank 2 thread 0 (reversed order) */
static uint32_t
local_region( uint32_t rank, uint32_t thread, uint32_t region )
{
    if ( rank == 2 && thread == 0 )
    {
        return NREGIONS - 1 - region;
    }
    return region;
}

static void
metric( OTF2_EvtWriter* w, OTF2_TimeStamp t, uint64_t i, uint32_t rank, uint32_t thread )
{
    OTF2_Type        types[ 3 ] = { OTF2_TYPE_UINT64, OTF2_TYPE_DOUBLE, OTF2_TYPE_INT64 };
    OTF2_MetricValue values[ 3 ];
    values[ 0 ].unsigned_int   = 1000000ULL * ( i + 1 ) + 1000 * rank + thread;
    values[ 1 ].floating_point = 0.25 * ( double )i + rank;
    values[ 2 ].signed_int     = ( i % 5 == 4 ) ? -( int64_t )( i + 1 ) : ( int64_t )( 3 * i );
    check( OTF2_EvtWriter_Metric( w, NULL, t, 0, 3, types, values ), "metric" );
}

int
main( int argc, char** argv )
{
    if ( argc != 5 )
    {
        fprintf( stderr, "usage: gen DIR RANKS THREADS ITERATIONS\n" );
        return 2;
    }
    const char* dir     = argv[ 1 ];
    uint32_t    ranks   = ( uint32_t )atoi( argv[ 2 ] );
    uint32_t    threads = ( uint32_t )atoi( argv[ 3 ] );
    uint64_t    iters   = ( uint64_t )atoll( argv[ 4 ] );
    if ( ranks < 3 || threads < 1 || iters < 1 )
    {
        fprintf( stderr, "gen: need at least 3 ranks, 1 thread, 1 iteration\n" );
        return 2;
    }

    OTF2_Archive* ar = OTF2_Archive_Open( dir, "traces", OTF2_FILEMODE_WRITE, 256 * 1024, 256 * 1024,
                                          OTF2_SUBSTRATE_POSIX, OTF2_COMPRESSION_NONE );
    if ( !ar )
    {
        fprintf( stderr, "gen: cannot open archive %s\n", dir );
        return 1;
    }
    check( OTF2_Archive_SetFlushCallbacks( ar, &flush_callbacks, NULL ), "flush callbacks" );
    check( OTF2_Archive_SetSerialCollectiveCallbacks( ar ), "collective callbacks" );
    check( OTF2_Archive_OpenEvtFiles( ar ), "open event files" );

    uint64_t  nlocs  = ( uint64_t )ranks * threads + 2;
    uint64_t* events = calloc( nlocs, sizeof( uint64_t ) );
    uint64_t  gpu    = loc_id( 0, threads ); /* the GPU stream of rank 0 */
    uint64_t  power  = loc_id( 1, threads ); /* the metric location of rank 1 */
    uint64_t  end    = OFFSET + ( iters + 2 ) * STEP;

    for ( uint32_t r = 0; r < ranks; r++ )
    {
        for ( uint32_t th = 0; th < threads; th++ )
        {
            OTF2_EvtWriter* w = OTF2_Archive_GetEvtWriter( ar, loc_id( r, th ) );
            OTF2_TimeStamp  t = OFFSET + 1000 * r + 100 * th;
            check( OTF2_EvtWriter_Enter( w, NULL, t, local_region( r, th, R_MAIN ) ), "enter" );
            for ( uint64_t i = 0; i < iters; i++ )
            {
                OTF2_TimeStamp b = OFFSET + ( i + 1 ) * STEP + 1000 * r + 100 * th;
                if ( th > 0 && i % 4 != 0 )
                {
                    continue;
                }
                check( OTF2_EvtWriter_Enter( w, NULL, b, local_region( r, th, R_COMPUTE ) ), "enter" );
                metric( w, b + 10, i, r, th );
                check( OTF2_EvtWriter_Leave( w, NULL, b + 40000 + 7 * ( i % 1000 ), local_region( r, th, R_COMPUTE ) ), "leave" );
                if ( th > 0 )
                {
                    continue;
                }
                uint32_t next = ( r + 1 ) % ranks, prev = ( r + ranks - 1 ) % ranks;
                check( OTF2_EvtWriter_Enter( w, NULL, b + 60000, local_region( r, th, R_SEND ) ), "enter" );
                check( OTF2_EvtWriter_MpiSend( w, NULL, b + 60100, next, 0, ( uint32_t )( i % 7 ), 8 * ( i + 1 ) ), "send" );
                check( OTF2_EvtWriter_Leave( w, NULL, b + 61000, local_region( r, th, R_SEND ) ), "leave" );
                check( OTF2_EvtWriter_MpiIsend( w, NULL, b + 62000, ranks - 1 - next, 1, 100 + ( uint32_t )( i % 3 ), 4096 + i, i ), "isend" );
                check( OTF2_EvtWriter_MpiIsendComplete( w, NULL, b + 62500, i ), "isend complete" );
                check( OTF2_EvtWriter_Enter( w, NULL, b + 70000, local_region( r, th, R_IRECV ) ), "enter" );
                check( OTF2_EvtWriter_MpiIrecvRequest( w, NULL, b + 70100, 1000000 + i ), "irecv request" );
                check( OTF2_EvtWriter_MpiIrecv( w, NULL, b + 71000, ranks - 1 - prev, 1, 100 + ( uint32_t )( i % 3 ), 4096 + i, 1000000 + i ), "irecv" );
                check( OTF2_EvtWriter_Leave( w, NULL, b + 72000, local_region( r, th, R_IRECV ) ), "leave" );
                check( OTF2_EvtWriter_Enter( w, NULL, b + 80000, local_region( r, th, R_BARRIER ) ), "enter" );
                check( OTF2_EvtWriter_MpiCollectiveBegin( w, NULL, b + 80100 ), "collective begin" );
                check( OTF2_EvtWriter_MpiCollectiveEnd( w, NULL, b + 90000, OTF2_COLLECTIVE_OP_BARRIER, 0, OTF2_UNDEFINED_UINT32, 0, 0 ), "collective end" );
                check( OTF2_EvtWriter_Leave( w, NULL, b + 90100, local_region( r, th, R_BARRIER ) ), "leave" );
            }
            check( OTF2_EvtWriter_Leave( w, NULL, end + 1000 * r + 100 * th, local_region( r, th, R_MAIN ) ), "leave" );
            check( OTF2_EvtWriter_GetNumberOfEvents( w, &events[ ( uint64_t )r * threads + th ] ), "number of events" );
            check( OTF2_Archive_CloseEvtWriter( ar, w ), "close event writer" );
        }
    }
    {
        OTF2_EvtWriter* w = OTF2_Archive_GetEvtWriter( ar, gpu );
        for ( uint64_t i = 0; i < iters; i += 2 )
        {
            OTF2_TimeStamp b = OFFSET + ( i + 1 ) * STEP + 30000;
            check( OTF2_EvtWriter_Enter( w, NULL, b, R_KERNEL ), "enter" );
            check( OTF2_EvtWriter_Leave( w, NULL, b + 20000, R_KERNEL ), "leave" );
        }
        check( OTF2_EvtWriter_GetNumberOfEvents( w, &events[ nlocs - 2 ] ), "number of events" );
        check( OTF2_Archive_CloseEvtWriter( ar, w ), "close event writer" );
    }
    {
        OTF2_EvtWriter* w = OTF2_Archive_GetEvtWriter( ar, power );
        for ( uint64_t i = 0; i < iters; i += 3 )
        {
            OTF2_Type        type = OTF2_TYPE_DOUBLE;
            OTF2_MetricValue v;
            v.floating_point = 180.0 + ( double )( i % 17 ) * 1.5;
            check( OTF2_EvtWriter_Metric( w, NULL, OFFSET + ( i + 1 ) * STEP + 5000, 2, 1, &type, &v ), "metric" );
        }
        check( OTF2_EvtWriter_GetNumberOfEvents( w, &events[ nlocs - 1 ] ), "number of events" );
        check( OTF2_Archive_CloseEvtWriter( ar, w ), "close event writer" );
    }
    check( OTF2_Archive_CloseEvtFiles( ar ), "close event files" );

    check( OTF2_Archive_OpenDefFiles( ar ), "open definition files" );
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        for ( uint32_t th = 0; th < threads; th++ )
        {
            OTF2_DefWriter* dw = OTF2_Archive_GetDefWriter( ar, loc_id( r, th ) );
            if ( r == 1 && th == 0 )
            {
                /* the clock of rank 1 runs 2 µs slow by the end */
                check( OTF2_DefWriter_WriteClockOffset( dw, OFFSET, 0, 0.0 ), "clock offset" );
                check( OTF2_DefWriter_WriteClockOffset( dw, end, 4800, 0.0 ), "clock offset" );
            }
            if ( r == 2 && th == 0 )
            {
                OTF2_IdMap* m = OTF2_IdMap_Create( OTF2_ID_MAP_DENSE, NREGIONS );
                for ( uint32_t k = 0; k < NREGIONS; k++ )
                {
                    check( OTF2_IdMap_AddIdPair( m, k, NREGIONS - 1 - k ), "id pair" );
                }
                check( OTF2_DefWriter_WriteMappingTable( dw, OTF2_MAPPING_REGION, m ), "mapping table" );
                OTF2_IdMap_Free( m );
            }
            check( OTF2_Archive_CloseDefWriter( ar, dw ), "close definition writer" );
        }
    }
    check( OTF2_Archive_CloseDefWriter( ar, OTF2_Archive_GetDefWriter( ar, gpu ) ), "close definition writer" );
    check( OTF2_Archive_CloseDefWriter( ar, OTF2_Archive_GetDefWriter( ar, power ) ), "close definition writer" );
    check( OTF2_Archive_CloseDefFiles( ar ), "close definition files" );

    OTF2_GlobalDefWriter* g = OTF2_Archive_GetGlobalDefWriter( ar );
    check( OTF2_GlobalDefWriter_WriteClockProperties( g, RES, OFFSET, end + 10000 - OFFSET, OTF2_UNDEFINED_TIMESTAMP ), "clock properties" );
    /* strings: 0 "", 1.. region names, then the rest */
    uint32_t s = 0;
    check( OTF2_GlobalDefWriter_WriteString( g, s++, "" ), "string" );
    for ( uint32_t k = 0; k < NREGIONS; k++ )
    {
        check( OTF2_GlobalDefWriter_WriteString( g, s++, region_names[ k ] ), "string" );
    }
    uint32_t s_node = s, s_thread = s + 1, s_gpu = s + 2, s_world = s + 3, s_rev = s + 4, s_cyc = s + 5, s_energy = s + 6, s_delta = s + 7, s_unit = s + 8, s_joule = s + 9, s_acc = s + 10, s_power = s + 11, s_watt = s + 12, s_meter = s + 13;
    const char* more[] = { "node", "thread", "GPU stream", "MPI_COMM_WORLD", "reversed", "PAPI_TOT_CYC", "energy", "delta", "#", "J", "GPU of rank 0", "node power", "W", "power meter" };
    for ( int k = 0; k < 14; k++ )
    {
        check( OTF2_GlobalDefWriter_WriteString( g, s++, more[ k ] ), "string" );
    }
    uint32_t s_rank = s;
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        char name[ 32 ];
        snprintf( name, sizeof name, "MPI Rank %" PRIu32, r );
        check( OTF2_GlobalDefWriter_WriteString( g, s++, name ), "string" );
    }
    for ( uint32_t k = 0; k < NREGIONS; k++ )
    {
        check( OTF2_GlobalDefWriter_WriteRegion( g, k, 1 + k, 1 + k, 0, OTF2_REGION_ROLE_FUNCTION, OTF2_PARADIGM_USER, OTF2_REGION_FLAG_NONE, 0, 0, 0 ), "region" );
    }
    check( OTF2_GlobalDefWriter_WriteSystemTreeNode( g, 0, s_node, s_node, OTF2_UNDEFINED_SYSTEM_TREE_NODE ), "system tree node" );
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        check( OTF2_GlobalDefWriter_WriteLocationGroup( g, r, s_rank + r, OTF2_LOCATION_GROUP_TYPE_PROCESS, 0, OTF2_UNDEFINED_LOCATION_GROUP ), "location group" );
    }
    check( OTF2_GlobalDefWriter_WriteLocationGroup( g, ranks, s_acc, OTF2_LOCATION_GROUP_TYPE_ACCELERATOR, 0, 0 ), "location group" );
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        for ( uint32_t th = 0; th < threads; th++ )
        {
            check( OTF2_GlobalDefWriter_WriteLocation( g, loc_id( r, th ), s_thread, OTF2_LOCATION_TYPE_CPU_THREAD, events[ ( uint64_t )r * threads + th ], r ), "location" );
        }
    }
    check( OTF2_GlobalDefWriter_WriteLocation( g, gpu, s_gpu, OTF2_LOCATION_TYPE_ACCELERATOR_STREAM, events[ nlocs - 2 ], ranks ), "location" );
    check( OTF2_GlobalDefWriter_WriteLocation( g, power, s_meter, OTF2_LOCATION_TYPE_METRIC, events[ nlocs - 1 ], 1 ), "location" );
    uint64_t* members = calloc( ranks, sizeof( uint64_t ) );
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        members[ r ] = loc_id( r, 0 );
    }
    check( OTF2_GlobalDefWriter_WriteGroup( g, 0, 0, OTF2_GROUP_TYPE_COMM_LOCATIONS, OTF2_PARADIGM_MPI, OTF2_GROUP_FLAG_NONE, ranks, members ), "group" );
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        members[ r ] = r;
    }
    check( OTF2_GlobalDefWriter_WriteGroup( g, 1, 0, OTF2_GROUP_TYPE_COMM_GROUP, OTF2_PARADIGM_MPI, OTF2_GROUP_FLAG_NONE, ranks, members ), "group" );
    for ( uint32_t r = 0; r < ranks; r++ )
    {
        members[ r ] = ranks - 1 - r;
    }
    check( OTF2_GlobalDefWriter_WriteGroup( g, 2, 0, OTF2_GROUP_TYPE_COMM_GROUP, OTF2_PARADIGM_MPI, OTF2_GROUP_FLAG_NONE, ranks, members ), "group" );
    check( OTF2_GlobalDefWriter_WriteComm( g, 0, s_world, 1, OTF2_UNDEFINED_COMM, OTF2_COMM_FLAG_NONE ), "comm" );
    check( OTF2_GlobalDefWriter_WriteComm( g, 1, s_rev, 2, 0, OTF2_COMM_FLAG_NONE ), "comm" );
    check( OTF2_GlobalDefWriter_WriteMetricMember( g, 0, s_cyc, s_cyc, OTF2_METRIC_TYPE_PAPI, OTF2_METRIC_ACCUMULATED_START, OTF2_TYPE_UINT64, OTF2_BASE_DECIMAL, 0, s_unit ), "metric member" );
    check( OTF2_GlobalDefWriter_WriteMetricMember( g, 1, s_energy, s_energy, OTF2_METRIC_TYPE_USER, OTF2_METRIC_ABSOLUTE_POINT, OTF2_TYPE_DOUBLE, OTF2_BASE_DECIMAL, 0, s_joule ), "metric member" );
    check( OTF2_GlobalDefWriter_WriteMetricMember( g, 2, s_delta, s_delta, OTF2_METRIC_TYPE_USER, OTF2_METRIC_RELATIVE_POINT, OTF2_TYPE_INT64, OTF2_BASE_DECIMAL, 0, s_unit ), "metric member" );
    OTF2_MetricMemberRef mm[ 3 ] = { 0, 1, 2 };
    check( OTF2_GlobalDefWriter_WriteMetricClass( g, 0, 3, mm, OTF2_METRIC_SYNCHRONOUS, OTF2_RECORDER_KIND_CPU ), "metric class" );
    check( OTF2_GlobalDefWriter_WriteMetricMember( g, 3, s_power, s_power, OTF2_METRIC_TYPE_OTHER, OTF2_METRIC_ABSOLUTE_POINT, OTF2_TYPE_DOUBLE, OTF2_BASE_DECIMAL, 0, s_watt ), "metric member" );
    OTF2_MetricMemberRef pm[ 1 ] = { 3 };
    check( OTF2_GlobalDefWriter_WriteMetricClass( g, 1, 1, pm, OTF2_METRIC_ASYNCHRONOUS, OTF2_RECORDER_KIND_ABSTRACT ), "metric class" );
    check( OTF2_GlobalDefWriter_WriteMetricInstance( g, 2, 1, power, OTF2_SCOPE_LOCATION_GROUP, 1 ), "metric instance" );
    check( OTF2_Archive_CloseGlobalDefWriter( ar, g ), "close global definition writer" );
    check( OTF2_Archive_Close( ar ), "close archive" );
    free( members );
    free( events );
    return 0;
}
