// Every op, for code that wants them all.
#pragma once

#include "core/autograd.h"
#include "core/tensor.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/nn_functional.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/residual.h"
#include "ops/shape_ops.h"
