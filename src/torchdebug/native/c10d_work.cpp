// A c10d collective's Work, as the native observer (observer.cpp) asks about it: whether it has
// completed, and a wait for it. A collective op (c10d::allreduce_, ...) returns its Work boxed as a
// custom class object; its outputs hold other ranks' values only once the Work completes, so the
// observer reads them then (capture/collectives.py's PendingCollectives, the dispatch mode's rule).
//
// Apart from observer.cpp because c10d's Work.hpp includes all of ATen (about twice the observer's
// build) and only a distributed run needs it: capture/native_capture.py loads this library for
// one, and hands its two entry points to the observer (td_observer_use_works).
//
// Plain extern "C" entry points taking a pointer to the IValue the op returned. The Work's virtual
// isCompleted, getFuture and wait, and the future's completed and devices, are the same in torch 2.11.0,
// 2.13.0 and 2.14.1.

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace {

c10d::Work* work_of(const void* value) {
  const auto& boxed = *static_cast<const c10::IValue*>(value);
  if (!boxed.isObject()) return nullptr;
  const auto& object = boxed.toObjectRef();
  if (object.slots().empty() || !object.getSlot(0).isCapsule()) return nullptr;
  // The capsule holds the Work a custom class object wraps (torch::class_'s layout, as toCustomClass reads it).
  return static_cast<c10d::Work*>(object.getSlot(0).toCapsule().get());
}

}  // namespace

extern "C" {

// 1 when the Work boxed in *value has completed (or *value boxes no Work: nothing to wait for), else 0.
// A Work whose future completed on the host counts as completed: gloo marks its future completed
// before the Work itself (finishWorkGloo), and what waited on the future (DDP's reducer, viewing its
// buckets at the backward's end) runs ops on the reduced values meanwhile. A future on devices
// (NCCL's, completed once the collective is queued) says nothing of the values: only the Work does.
int td_work_completed(const void* value) {
  auto* work = work_of(value);
  try {
    if (work == nullptr || work->isCompleted()) return 1;
  } catch (...) {  // a failed collective: its outputs are read as they are
    return 1;
  }
  try {
    auto future = work->getFuture();
    return future && future->completed() && future->devices().empty() ? 1 : 0;
  } catch (...) {  // a Work with no future
    return 0;
  }
}

// Wait for the Work boxed in *value (a collective still in flight when capture stops); 0 when the
// wait raised (its outputs are read as they are).
int td_work_wait(const void* value) {
  auto* work = work_of(value);
  try {
    if (work != nullptr && !work->isCompleted()) work->wait();
    return 1;
  } catch (...) {
    return 0;
  }
}

}  // extern "C"
