// Launch geometry shared by the kernels' host entry points (the Python loader mirrors it).
#pragma once

#define RIPPLES_THREADS 256
// Enough blocks to cover ~4 vectors per thread, capped: the grid-stride loops do the rest.
#define RIPPLES_MAX_BLOCKS 4096
#define RIPPLES_ELEMENTS_PER_BLOCK (RIPPLES_THREADS * 16)
