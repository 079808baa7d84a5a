#pragma once

#include "schedules/cost_model.h"
#include "schedules/schedule.h"
#include "schedules/topology.h"

namespace gs::sim {

/// Result of running one algorithm's schedules on the cost model.
struct Prediction {
  double seconds = 0;
  bool executed = false;  // false: the closed form was used (schedules too large to run, or
                          // ranks outnumbering a host's cores)
};

/// Runs the allreduce schedules of every rank (the ones the engine runs) as timed messages:
/// a message of S bytes over link class c leaves when its data is ready (a forwarded or
/// dependent message after the first chunk of its input, pipelining) and its sender's link is
/// free, takes alpha + S * beta * codecRatio, and a reduction adds S * gamma; a rank runs its
/// steps in order. Falls back to predictAllReduceSeconds when N x steps exceeds maxSteps.
Prediction simulateAllReduce(stream::Algorithm algo,
                             const stream::Topology& topology,
                             double bytes,
                             const stream::CostModel& model,
                             size_t maxSteps = 2'000'000);

}  // namespace gs::sim
