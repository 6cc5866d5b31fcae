// The cells of the op library, listed once. Every list of cells in csrc/ is made from this one: the op
// schemas and the autograd registrations (lltm.cpp, lltm_autograd.cpp), each device's kernels and their
// registrations (lltm_cpu.cpp, lltm_cuda*.cu). A cell is its trait in cells.h plus its line here; Python
// lists the same cells in lltm_train/ops/cells.py (a test checks that both agree).
#pragma once

#include "cells.h"

// X(Cell) for every cell.
#define LLTM_FOR_EACH_CELL(X) \
  X(::lltm::LLTMCell)         \
  X(::lltm::LSTMCell)         \
  X(::lltm::GRUCell)          \
  X(::lltm::RNNTanhCell)      \
  X(::lltm::RNNReLUCell)      \
  X(::lltm::SLSTMCell)
