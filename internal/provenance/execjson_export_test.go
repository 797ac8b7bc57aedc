package provenance

// DecodeExecs exposes the batch decoder to the benchmarks, without the
// validation and normalization DecodeBatch adds.
var DecodeExecs = decodeExecs
