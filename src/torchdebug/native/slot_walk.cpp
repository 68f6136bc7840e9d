// The slot walk: what only the order of the native observer's drained rows and slots tells (issue
// 48), in one pass per drain with no Python per row or slot. capture/native_values.py loads it and
// hands it the drained arrays: td_walk_rows gives each row its call (phase, module, call index, the
// forward call a backward row belongs to); td_walk, told which rows are recorded, gives per recorded
// slot its value id and view_of, where its statistics come from, and why it is not read, as arrays.
//
// - Calls as NativeStepCapture names rows: phase backward for rows the engine ran, optimizer or
//   forward by module context, recompute for activation checkpointing's (recompute.py's rules); a
//   backward row the module (and stack) of the forward row that made its autograd node (equal
//   sequence numbers), a gradient accumulation its parameter's path; the call index per (phase,
//   module, op) in row order, counted through the step.
// - Value ids as value_ids.py gives them to eager capture's slots, from TensorImpl addresses: a
//   tensor is the one last seen at its address while its memory (storage, offset, shape, dtype) is
//   the same. An op's output is a new value unless it is one of the op's arguments (an in-place
//   op's, lift_fresh's); a backward op's input first seen over the memory a value was made in this
//   step is that value (autograd unpacks a saved output as a new TensorImpl); another input first
//   seen is a new value, and, when autograd knows it as a view, names its base's (the value seen at
//   the base's address on that storage, or a new one). A view op's new outputs name their first
//   argument's memory owner. The observer holds each address weakly until it reports it freed
//   (freed, after that drain's slots): an address names one tensor meanwhile, and a storage's one
//   storage.
// - Shared statistics as CaptureSession shares them: a tensor seen again at the same version and
//   memory, and the only output of a copy or a view with its argument's elements (alias_of), has
//   the statistics taken first; else the callback's sums, a kept tensor's (taken at the flush), or
//   none (it changed before the flush). Fingerprints the same way, as CaptureSession.share_alias
//   shares them: a view shares its argument's only where it reads the same memory in the same order
//   (both contiguous from the same offset), a copy always; else the callback's, or a kept tensor's.
// - Memory that holds no value of the run yet, as unwritten.py follows it: a slot on it is
//   "uninitialised"; an argument an op overwrites without reading it is described, not read.
//
// Plain C++, no torch headers: extern "C" entry points loaded with ctypes. State lives in a Walk
// per capture (td_walk_new), never in globals: two debuggers share nothing.

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "address_map.h"

namespace {

constexpr int8_t kPlain = 0;  // observer.py's PLAIN: a slot whose sizes were read
constexpr int8_t kSubclass = 1;  // observer.py's SUBCLASS: a subclass instance (sizes and values: its plain tensor's, if read)
constexpr int8_t kValue = 4;  // observer.py's VALUE: a non-tensor argument or result (no tensor, no value id)
constexpr int8_t kChanged = 3;  // error code: a kept tensor changed or freed before the flush
constexpr int8_t kUninitialised = 1;  // unread code of "uninitialised" (native_values.py's table)
constexpr int64_t kNone = -1;

enum OpFlag : int {
  kMutable = 1, kMakesViews = 2, kValuePreserving = 4, kOneTensor = 8, kListResult = 16, kSkipped = 32, kAccumulates = 64, kDetach = 128,
  kCollective = 256, kModule = 512, kUnreturned = 1024
};
// kAccumulates: the op the engine sums gradients in place with (aten.add_.Tensor in a backward row),
// which a dispatch mode runs out of place (a new tensor, at version 0). kDetach: aten.detach.default.
// kCollective: a c10d op, whose outputs are tensors it was handed (its lists, recv_'s argument) and
// come once its Work completes, after the slots of the rows that ran meanwhile (observer.cpp).
// kModule: observer.cpp's kModuleOp, a module call's tensors (level "mix"): skipped by the naming,
// its slots, all inputs, walked whichever sides are recorded (native_modules.py filters them).
// kUnreturned: an op that writes arguments and returns nothing (an in-place _foreach_ op): its
// outputs are the arguments it wrote (observer.cpp's note_written), named as its inputs.
enum Phase : int8_t { kForward = 0, kBackward = 1, kOptimizer = 2, kRecompute = 3, kNoPhase = -1 };
enum RowMark : int8_t { kGradOn = 1, kCheckpointNode = 2, kRecomputed = 4, kNoNode = 8, kFoundHidden = 16, kCompiled = 32 };
// Per row: the observer's marks (observer.cpp's RowMark: kGradOn, grad mode was on, so the op's
// node, if it makes one, is the one after the last made before it; kCheckpointNode, run by a
// reentrant checkpoint's node; kNoNode, a forward op whose sequence number no node of its took;
// kFoundHidden, a row found hidden after it was recorded, skipped as a skipped op's; kCompiled, an
// op of compiled code, whose slots share no statistics: inductor's kernels write there unseen),
// and kRecomputed, which native_recompute.py adds: a recomputation's op or checkpoint's own
// bookkeeping (phase recompute).
constexpr int64_t kLookahead = 64;   // recompute.py's LOOKAHEAD
constexpr int64_t kLookback = 4096;  // recompute.py's LOOKBACK
constexpr int64_t kOutside = -1, kInOptimizer = -2;  // module contexts that name no path (native_records.py)
constexpr int64_t kFirstOwner = -3;  // contexts from here down: owner kFirstOwner - context (an FSDP2 group's op, observer.cpp's Owners)

// A slot's arg: its argument's (or result's) position, and for an item of a list of lists (c10d's
// Tensor[][]) the outer index plus one shifted by kOuterShift (observer.cpp's), its element the inner
// index. As (position, outer index or -1).
constexpr int kOuterShift = 8;
std::pair<int, int> split_arg(int16_t arg) {
  auto bits = static_cast<uint16_t>(arg);
  return {bits & ((1 << kOuterShift) - 1), (bits >> kOuterShift) - 1};
}

struct Memory {
  int64_t storage = 0;
  int64_t offset = 0;
  int32_t shape = 0;  // an interned shape (Shapes)
  int8_t dtype = 0;
  bool partial = false;  // only the storage is known: a base seen through a view of it
  bool operator==(const Memory&) const = default;
};

template <>
struct MapKey<Memory> {  // a memory as an AddressMap key: no storage address is INT64_MIN
  static Memory empty() { return Memory{INT64_MIN}; }
  static bool is_empty(const Memory& memory) { return memory.storage == INT64_MIN; }
  static uint64_t hash(const Memory& memory) {
    uint64_t hash = static_cast<uint64_t>(memory.storage) * 0x9E3779B97F4A7C15ULL;
    hash = (hash ^ static_cast<uint64_t>(memory.offset)) * 0x100000001B3ULL + (hash >> 29);
    uint64_t rest = static_cast<uint64_t>(static_cast<uint32_t>(memory.shape)) << 16 |
                    static_cast<uint64_t>(static_cast<uint8_t>(memory.dtype)) << 1 | (memory.partial ? 1 : 0);
    return hash ^ rest;
  }
};

// A memory a recomputation's detach made a tensor in, for the forward call whose saved tensor it
// restores (its place in Walk::log): what a backward op of that call's node unpacks.
struct Unpack {
  Memory memory;
  int64_t call = 0;
  bool operator==(const Unpack&) const = default;
};

template <>
struct MapKey<Unpack> {
  static Unpack empty() { return Unpack{MapKey<Memory>::empty()}; }
  static bool is_empty(const Unpack& unpack) { return MapKey<Memory>::is_empty(unpack.memory); }
  static uint64_t hash(const Unpack& unpack) {
    return MapKey<Memory>::hash(unpack.memory) ^ (static_cast<uint64_t>(unpack.call) * 0xC2B2AE3D27D4EB4FULL);
  }
};

// Shapes by id, so that a memory is a few integers: as many as the run has distinct shapes. Found by
// a 63-bit hash of the sizes in an AddressMap (a shape whose hash another took: by its bytes).
class Shapes {
 public:
  int32_t id(const int64_t* sizes, int ndim) {
    std::string_view key(reinterpret_cast<const char*>(sizes), static_cast<size_t>(ndim) * sizeof(int64_t));
    uint64_t hash = 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(ndim + 1);
    for (int dim = 0; dim < ndim; ++dim) hash = (hash ^ static_cast<uint64_t>(sizes[dim])) * 0x100000001B3ULL + (hash >> 31);
    auto hashed = static_cast<int64_t>(hash & INT64_MAX);  // (never AddressMap's empty key)
    auto* hit = by_hash_.find(hashed);
    if (hit != nullptr && stored_[static_cast<size_t>(hit->second)] == key) return hit->second;
    auto found = ids_.find(key);
    if (found == ids_.end()) {
      auto& stored = stored_.emplace_back(key);  // a deque: the views into it stay valid
      found = ids_.emplace(std::string_view(stored), static_cast<int32_t>(ids_.size())).first;
    }
    by_hash_.try_emplace(hashed, found->second);
    return found->second;
  }

 private:
  std::deque<std::string> stored_;  // by id
  std::unordered_map<std::string_view, int32_t> ids_;
  AddressMap<int32_t> by_hash_;
};

struct Value {
  int64_t id;
  int64_t view_of;  // kNone: no view
};

struct Known {  // the tensor last seen at an address
  Value value;
  Memory memory;
};

struct Seen {  // a tensor's first statistics and fingerprint this step
  int64_t version;
  Memory memory;
  int64_t stats;        // the references the walk gave it (kNone: not taken)
  int64_t fingerprint;
  int64_t drain;  // references name the slots of one drain
  bool view = false;  // a view op's output: version is the one a dispatch mode reads (Walk::mode_version)
  int64_t writes = 0;  // Walk::writes_into its storage then
};

struct OpFacts {
  int flags = 0;
  std::vector<std::string> inputs;  // by schema position: "0", "1", a keyword-only argument's name
  std::vector<int8_t> unread_inputs;  // by schema position: an unread code, 0 none
  std::vector<int8_t> unread_outputs;  // by result position (a list result: by element)
  int8_t unread_other_outputs = 0;  // the results beyond unread_outputs ("*")
  AddressMap<int32_t> arg_codes;  // (io, arg, element) → the interned arg
};

struct Source {  // the row's first argument, a plain tensor
  int64_t address = 0, version = 0, numel = 0, device = 0;
  bool contiguous = false;
  Memory memory;
};

// Whether sizes and strides are those of a contiguous tensor (torch's is_contiguous: dims of size 1
// take any stride, and a tensor without elements is contiguous).
bool contiguous(const int64_t* sizes, const int64_t* strides, int ndim) {
  int64_t expected = 1;
  for (int dim = ndim - 1; dim >= 0; --dim) {
    if (sizes[dim] == 0) return true;
    if (sizes[dim] != 1 && strides[dim] != expected) return false;
    expected *= sizes[dim];
  }
  return true;
}

struct Call {  // a forward (or recomputed) row, by the sequence number of the autograd node it made
  int64_t module;
  int32_t op;
  int64_t call;
  int64_t stack;
  int64_t index = kNone;  // its place in the step's forward calls (Walk::log), kNone for a recomputed one
  int8_t phase = kForward;
};

// recompute.py's RecomputePairing: the forward call each op of the recomputation under way repeats.
struct Pairing {
  int64_t node = INT64_MIN;  // the node whose backward runs the recomputation
  int64_t next = kNone;      // where the next pair is looked for; kNone until the region's start is known
  int64_t before = kNone;    // the forward call that made that node

  const Call* pair(const std::vector<Call>& log, const AddressMap<Call>& made_by, int64_t key, int32_t op,
                   int64_t module, bool reentrant) {
    if (key != node) {
      auto made = made_by.find(key);
      node = key;
      before = made != nullptr ? made->second.index : kNone;
      next = reentrant ? before : kNone;
    }
    auto size = static_cast<int64_t>(log.size());
    int64_t found = kNone;
    if (next == kNone) {
      if (module != kOutside && before != kNone) {
        for (auto at = std::min(before, size - 1); at > std::max(before - kLookback, kNone); --at) {
          if (log[at].op == op && log[at].module == module) {
            found = at;
            break;
          }
        }
      }
    } else if (module == kOutside) {
      found = next < size && log[next].op == op ? next : kNone;
    } else {
      for (auto at = next; at < std::min(next + kLookahead, size); ++at) {
        if (log[at].op == op && log[at].module == module) {
          found = at;
          break;
        }
      }
    }
    if (found == kNone) return nullptr;
    next = found + 1;
    return &log[found];
  }
};

struct Walk {
  AddressMap<OpFacts> ops;  // by observer op id
  Shapes shapes;
  AddressMap<int64_t> calls;  // this step: calls so far by (phase, module, op)
  AddressMap<Call> made_by;   // this step's forward rows
  AddressMap<bool> claimed;   // the nodes of made_by a call made with grad mode on took first (the math-bit fallback's clone)
  std::vector<Call> log;      // this step's forward calls, in order
  Pairing pairing;
  std::unordered_map<int64_t, int64_t> rebuilt;  // recompute.py's RebuiltTensors: address → the module that made it
  // The last drain's rows (by index) whose output is a tensor a checkpoint rebuilt → the last node
  // made before each (a recomputed op's node, whose saved tensor it is; recomputation's pack hook).
  std::unordered_map<int64_t, int64_t> rebuilds;
  AddressMap<int64_t, Memory> unpacks;  // this step: the memory of each such tensor → its address (the last one's)
  AddressMap<int64_t, Unpack> unpacks_for;  // and by the forward call whose saved tensor it restores
  std::vector<int64_t> forward_of;  // the last drain's rows (by index): the forward call a backward row differentiates (Call::index)
  AddressMap<Known> at;
  AddressMap<Value, Memory> made_in;  // this step: the value first made in a memory
  AddressMap<Seen> seen;  // this step, by address
  AddressMap<bool> unwritten;  // storages of allocations nothing has written since (a set)
  AddressMap<int64_t> summed_in;  // this step: storage → its version after the engine's in-place sum

  // The version a dispatch mode reads of a tensor on `storage` at `version`: less the writes of the
  // engine's in-place gradient sums, which the mode runs out of place (its sum a new tensor at 0).
  int64_t mode_version(int64_t storage, int64_t version) const {
    auto found = summed_in.find(storage);
    return found == summed_in.end() ? version : version - found->second;
  }

  // Whether what `known` took this drain holds for a tensor over `memory` at `version`.
  bool still(const Seen& known, const Memory& memory, int64_t version) const {
    return known.drain == drains && known.memory == memory &&
           known.version == (known.view ? mode_version(memory.storage, version) : version) &&
           known.writes == writes_of(memory.storage);
  }
  // Ops that may write each storage, this step (their mutable arguments): a tensor seen on it before
  // one is read again, though its own version did not move (`p.data.mul_()` writes through an alias
  // with a version counter of its own).
  AddressMap<int64_t> writes_into;
  int64_t writes_of(int64_t storage) const {
    auto found = writes_into.find(storage);
    return found == writes_into.end() ? 0 : found->second;
  }
  int64_t fresh = 0;
  int64_t drains = 0;
  int64_t row = -1;  // the row whose inputs follow
  AddressMap<Value> inputs;
  AddressMap<bool> input_storages;  // a set
  std::vector<std::string> args;  // interned: "0", "1.2", "out"
  std::vector<int8_t> arg_io;
  std::unordered_map<std::string, int32_t> arg_index[2];

  int32_t intern(int8_t io, const std::string& arg) {
    auto [found, added] = arg_index[io].emplace(arg, static_cast<int32_t>(args.size()));
    if (added) {
      args.push_back(arg);
      arg_io.push_back(io);
    }
    return found->second;
  }

  // The arg of a slot, as a dispatch mode's iter_slots names it (OpSlotNames.inputs by position).
  int32_t arg_code(OpFacts& op, int8_t io, int16_t arg, int16_t element) {
    int64_t key = (static_cast<int64_t>(io) << 40) | (static_cast<int64_t>(static_cast<uint16_t>(arg)) << 20) |
                  static_cast<int64_t>(static_cast<uint16_t>(element));
    auto found = op.arg_codes.find(key);
    if (found != op.arg_codes.end()) return found->second;
    auto [position, outer] = split_arg(arg);
    std::string name;
    if (io == 0 || (op.flags & kUnreturned)) {
      name = static_cast<size_t>(position) < op.inputs.size() ? op.inputs[position] : std::to_string(position);
    } else if (op.flags & kListResult) {
      name = std::to_string(outer >= 0 ? outer : element);
    } else {
      name = std::to_string(position);
    }
    if (outer >= 0 && !(io == 1 && (op.flags & kListResult))) name += "." + std::to_string(outer);
    if (element >= 0 && !(io == 1 && (op.flags & kListResult) && outer < 0)) name += "." + std::to_string(element);
    return op.arg_codes[key] = intern(io, name);
  }

  int64_t base_id(int64_t base, int64_t storage) {
    auto known = at.find(base);
    if (known != at.end() && known->second.memory.storage == storage) {
      const auto& value = known->second.value;
      return value.view_of != kNone ? value.view_of : value.id;
    }
    int64_t id = fresh++;
    Memory partial;
    partial.storage = storage;
    partial.partial = true;
    at[base] = Known{{id, kNone}, std::move(partial)};
    return id;
  }

  // The address of the tensor a backward op of forward call `call`'s node unpacks over `memory` (0: none).
  int64_t unpacked(const Memory& memory, int64_t call) const {
    if (call != kNone) {
      auto found = unpacks_for.find(Unpack{memory, call});
      if (found != unpacks_for.end()) return found->second;
    }
    auto found = unpacks.find(memory);
    return found != unpacks.end() ? found->second : 0;
  }

  // NativeValueIds.of: the value of a slot of `at_row` (slots in row order, each row's inputs first);
  // `restored`: an input's value when it is a tensor a checkpoint restored (Walk::unpacked's).
  Value of(int64_t at_row, int8_t io, int64_t address, const Memory& memory, bool backward, int64_t base,
           const Value* restored = nullptr, bool collective = false) {
    if (at_row != row) {
      row = at_row;
      inputs.clear();
      input_storages.clear();
    }
    Value value{kNone, kNone};
    auto known = at.find(address);
    if (io == 0) {
      if (known != at.end() && (known->second.memory == memory ||
                                (known->second.memory.partial && known->second.memory.storage == memory.storage))) {
        value = known->second.value;
      } else {
        auto made = backward && restored == nullptr ? made_in.find(memory) : made_in.end();
        if (restored != nullptr) {
          value = *restored;
        } else if (made != made_in.end()) {
          value = made->second;
        } else {
          value.id = fresh++;
          if (base != 0) value.view_of = base_id(base, memory.storage);
          made_in[memory] = value;
        }
      }
      inputs[address] = value;
      input_storages.insert(memory.storage);
    } else if (auto argument = inputs.find(address); argument != inputs.end()) {
      value = argument->second;  // an argument the op returns (it wrote it, or lift_fresh)
    } else if (collective && known != at.end() && known->second.memory == memory) {
      value = known->second.value;  // a collective's, after other rows' slots: one of its arguments
    } else {
      value.id = fresh++;
      if (!input_storages.contains(memory.storage)) {  // fresh memory, not a view of an input
        made_in[memory] = value;
      } else {
        made_in.try_emplace(memory, value);
      }
    }
    at[address] = Known{value, memory};
    return value;
  }

  // A view op's output `value` at `address` in `memory`, made from `source`: it names the source's owner.
  void made_view(Value& value, int64_t address, const Memory& memory, Value source) {
    value.view_of = source.view_of != kNone ? source.view_of : source.id;
    at[address].value.view_of = value.view_of;
    auto made = made_in.find(memory);
    if (made != made_in.end() && made->second.id == value.id) made->second.view_of = value.view_of;
  }

  void forget(int64_t address, const Memory& memory) {
    at.erase(address);
    made_in.erase(memory);
  }

  // NativeUnwritten.why: why a plain recorded slot is described and not read (0: it is read), and
  // what that tells of its storage.
  int8_t unread(const OpFacts& op, int8_t io, int16_t arg, int16_t element, int64_t storage, int64_t numel) {
    int8_t why;
    auto [position, outer] = split_arg(arg);
    if (io == 0) {
      why = static_cast<size_t>(position) < op.unread_inputs.size() ? op.unread_inputs[position] : 0;
    } else {
      auto index = static_cast<size_t>((op.flags & kListResult) ? (outer >= 0 ? outer : element) : position);
      why = index < op.unread_outputs.size() ? op.unread_outputs[index] : op.unread_other_outputs;
    }
    bool is_mutable = op.flags & kMutable;
    if (why == 0 && !unwritten.empty()) {
      if (io && is_mutable) {  // an in-place op's written argument holds values from now on
        unwritten.erase(storage);
      } else if (unwritten.contains(storage)) {
        why = kUninitialised;
      }
    }
    if (why == 0 || numel == 0) {
      if (io && !is_mutable && !(op.flags & kMakesViews)) unwritten.erase(storage);  // fresh memory: an address reused
      return 0;
    }
    if (why == kUninitialised && io) {
      unwritten.insert(storage);
    } else if (why != kUninitialised) {  // the op writes it
      unwritten.erase(storage);
    }
    return why;
  }

  // _alias_source: what an op's only output shares with its first argument (a copy or a view with
  // its elements, of an argument whose statistics or fingerprint were taken at its version), or null.
  const Seen* alias_of(const OpFacts& op, const Source& source, const Memory& memory, int64_t numel, int64_t device) {
    if (numel != source.numel || memory.dtype != source.memory.dtype) return nullptr;
    if (!(op.flags & kValuePreserving) && (device != source.device || memory.storage != source.memory.storage)) return nullptr;
    auto known = seen.find(source.address);
    if (known == seen.end() || !still(known->second, source.memory, source.version)) return nullptr;
    return &known->second;
  }
};

template <typename T>
const T* column(void* const* columns, int index) {
  return static_cast<const T*>(columns[index]);
}

}  // namespace

extern "C" {

void* td_walk_new() { return new (std::nothrow) Walk(); }

void td_walk_free(void* walk) { delete static_cast<Walk*>(walk); }

// A new step: the memory values were made in, and the statistics taken, are another step's.
void td_walk_next_step(void* walk) {
  auto& state = *static_cast<Walk*>(walk);
  state.made_in.clear();
  state.summed_in.clear();
  state.seen.clear();
  state.writes_into.clear();
  state.calls.clear();
  state.made_by.clear();
  state.claimed.clear();
  state.log.clear();
  state.pairing = Pairing{};
  state.rebuilt.clear();
  state.unpacks.clear();
  state.unpacks_for.clear();
  state.row = -1;
}

// What the walk needs of op `op` (an observer op id): OpFlag bits; its inputs' names by schema
// position, each ended by '\n'; the unread codes of its inputs (n_inputs), of its results
// (n_outputs, by element for a list result) and of the results beyond them. Returns 0, -1 on failure.
int td_walk_op(void* walk, int op, int flags, const char* input_names, int n_inputs, const int8_t* unread_inputs,
               int n_outputs, const int8_t* unread_outputs, int unread_other_outputs) {
  try {
    OpFacts facts;
    facts.flags = flags;
    for (const char* name = input_names; *name != '\0';) {
      const char* end = std::strchr(name, '\n');
      facts.inputs.emplace_back(name, end);
      name = end + 1;
    }
    facts.unread_inputs.assign(unread_inputs, unread_inputs + n_inputs);
    facts.unread_outputs.assign(unread_outputs, unread_outputs + n_outputs);
    facts.unread_other_outputs = static_cast<int8_t>(unread_other_outputs);
    static_cast<Walk*>(walk)->ops[op] = std::move(facts);
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// Name the drained rows as NativeStepCapture.name_rows describes (counts: rows, parameter contexts):
// per row its phase (kNoPhase: an op capture skips), module (a context, -1 for none), call index
// per (phase, module, op) in row order from the rows named before in this step, and the forward call
// a backward row differentiates or a recomputed row repeats (module, op, call, phase; op -1: none)
// and a backward row's stack, that call's (a stack id, -1 none; other rows keep their own).
// Recomputation as eager.py names it: a row native_records.py marks kRecomputed is phase recompute,
// paired with the forward call it repeats (Pairing), and so is a backward detach of a tensor a
// checkpoint rebuilt (its module the rebuilding call's). columns: the rows' op ids, sequence
// numbers, backward marks, module contexts and stacks; the contexts that are a parameter's path (a
// gradient accumulation's); the outputs phase, module, call, fwd module, fwd op, fwd call, stack;
// then the rows' RowMarks, the last node made before each, the TensorImpl address of each row's
// first input and first output (0: none), the output fwd phase; and (counts[2] of them) each owner's
// phase (-1: the row's own) and module context. A row an owner's context names (<= kFirstOwner) is
// that owner's module's, in its phase, differentiating and repeating nothing: an FSDP2 group's op,
// as eager.py's _module names it (a backward one without a stack). Returns 0, -1 on failure.
int td_walk_rows(void* walk, const int64_t* counts, void* const* columns) {
  try {
    auto& state = *static_cast<Walk*>(walk);
    auto rows = counts[0], parameters = counts[1], owners = counts[2];
    auto row_op = column<int32_t>(columns, 0);
    auto row_seq = column<int64_t>(columns, 1);
    auto row_backward = column<int8_t>(columns, 2);
    auto row_module = column<int64_t>(columns, 3);
    auto row_stack = column<int64_t>(columns, 4);
    auto parameter_contexts = column<int64_t>(columns, 5);
    auto out_phase = static_cast<int8_t*>(columns[6]);
    auto out_module = static_cast<int64_t*>(columns[7]);
    auto out_call = static_cast<int64_t*>(columns[8]);
    auto out_fwd_module = static_cast<int64_t*>(columns[9]);
    auto out_fwd_op = static_cast<int32_t*>(columns[10]);
    auto out_fwd_call = static_cast<int64_t*>(columns[11]);
    auto out_stack = static_cast<int64_t*>(columns[12]);
    auto row_mark = column<int8_t>(columns, 13);
    auto row_made = column<int64_t>(columns, 14);
    auto row_input = column<int64_t>(columns, 15);
    auto row_output = column<int64_t>(columns, 16);
    auto out_fwd_phase = static_cast<int8_t*>(columns[17]);
    auto owner_phase = column<int8_t>(columns, 18);
    auto owner_module = column<int64_t>(columns, 19);
    std::unordered_set<int64_t> accumulations(parameter_contexts, parameter_contexts + parameters);
    state.rebuilds.clear();
    state.forward_of.assign(static_cast<size_t>(rows), kNone);
    for (int64_t row = 0; row < rows; ++row) {
      auto found = state.ops.find(row_op[row]);
      if (found == state.ops.end()) return -1;  // facts not given: the caller's error
      out_fwd_op[row] = -1;
      out_fwd_module[row] = out_fwd_call[row] = kNone;
      out_fwd_phase[row] = kForward;
      out_stack[row] = row_stack[row];
      if ((found->second.flags & kSkipped) || (row_mark[row] & kFoundHidden)) {
        out_phase[row] = kNoPhase;
        out_module[row] = kOutside;
        out_call[row] = 0;
        continue;
      }
      int64_t seq = row_seq[row], context = row_module[row], module = context >= 0 ? context : kOutside;
      int64_t owner = kFirstOwner - context;
      if (owner >= 0 && owner < owners) {
        context = owner_module[owner];
        module = context;
      }
      bool detach = found->second.flags & kDetach;
      auto rebuilt = detach && row_input[row] != 0 ? state.rebuilt.find(row_input[row]) : state.rebuilt.end();
      const Call* from = nullptr;  // the forward call a backward row differentiates, or a recomputed one repeats
      Phase phase;
      if (row_backward[row] && rebuilt != state.rebuilt.end()) {  // autograd unpacks a tensor a checkpoint rebuilt
        phase = kRecompute;
        module = rebuilt->second;
      } else if (row_backward[row] && (row_mark[row] & kRecomputed)) {
        phase = kRecompute;
        if (!detach) from = state.pairing.pair(state.log, state.made_by, seq, row_op[row], module, row_mark[row] & kCheckpointNode);
        if (from != nullptr) module = from->module;
      } else if (row_backward[row]) {
        phase = kBackward;
        auto made = seq >= 0 ? state.made_by.find(seq) : state.made_by.end();
        out_stack[row] = kNone;
        if (made != state.made_by.end()) {
          from = &made->second;
          module = from->module;
          out_stack[row] = from->stack;
          state.forward_of[static_cast<size_t>(row)] = from->index;
        } else {  // a gradient accumulation is named after the parameter
          module = accumulations.contains(context) ? context : kOutside;
        }
      } else if (context == kInOptimizer) {
        phase = kOptimizer;
        module = kOutside;
      } else {
        phase = row_mark[row] & kRecomputed ? kRecompute : kForward;  // checkpoint's own bookkeeping: recompute
      }
      if (owner >= 0 && owner < owners) {
        if (owner_phase[owner] >= 0) phase = static_cast<Phase>(owner_phase[owner]);
        module = context;
        from = nullptr;
        state.forward_of[static_cast<size_t>(row)] = kNone;
        if (phase == kBackward) out_stack[row] = kNone;
      }
      if (from != nullptr) {
        out_fwd_module[row] = from->module;
        out_fwd_op[row] = from->op;
        out_fwd_call[row] = from->call;
        out_fwd_phase[row] = from->phase;
      }
      uint64_t key = (static_cast<uint64_t>(module + 1) << 32) ^ (static_cast<uint64_t>(row_op[row]) << 2) ^
                     static_cast<uint64_t>(phase);
      int64_t call = state.calls[static_cast<int64_t>(key)]++;  // (never INT64_MIN: 0 <= module + 1 < 2^31)
      out_phase[row] = phase;
      out_module[row] = module;
      out_call[row] = call;
      // What later rows take from this one (eager.py's OpCapture._remember): a forward call, by the
      // node it made (or, made none, the last node made before it: a reentrant region's first op
      // names its checkpoint's node); a recomputed call, for the backward through the nodes it made.
      Call own{module, row_op[row], call, out_stack[row], kNone, phase};
      if (phase == kForward) {
        own.index = static_cast<int64_t>(state.log.size());
        state.log.push_back(own);
        if (seq >= 0 && !(row_mark[row] & kNoNode)) {
          if (!state.claimed.contains(seq)) state.made_by[seq] = own;
        } else if (row_made[row] >= 0 && !state.made_by.contains(row_made[row])) {
          // The first call to follow a node claims it, as eager.py's _remember does (setdefault); the
          // node's own op takes it back from a call made with grad mode off only. With grad mode on, that first
          // call is one recorded before the node's op though made after the node: the math-bit
          // fallback's clone of an argument (observer.cpp), which a mode sees first.
          state.made_by[row_made[row]] = own;
          if (row_mark[row] & kGradOn) state.claimed[row_made[row]] = true;
        }
      } else if (phase == kRecompute && !detach) {  // a backward row's seq is the node run: its own comes after the last made
        Call made = from != nullptr ? *from : own;  // (a copy: an insert may move made_by's entries)
        if (row_mark[row] & kGradOn) {
          state.made_by[row_made[row] + 1] = made;
        } else if (row_made[row] >= 0) {
          state.made_by.try_emplace(row_made[row], made);
        }
      } else if (phase == kRecompute && rebuilt == state.rebuilt.end() && row_output[row] != 0) {
        state.rebuilt[row_output[row]] = module;  // a checkpoint detaches each tensor it rebuilds or keeps
        state.rebuilds[row] = row_made[row];
      }
    }
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// What the walk holds now (its memory): counts[0..3] the addresses it knows, the memories values
// were made in this step, the statistics seen this step, the unwritten storages.
void td_walk_entries(void* walk, int64_t* counts) {
  auto& state = *static_cast<Walk*>(walk);
  counts[0] = static_cast<int64_t>(state.at.size());
  counts[1] = static_cast<int64_t>(state.made_in.size());
  counts[2] = static_cast<int64_t>(state.seen.size());
  counts[3] = static_cast<int64_t>(state.unwritten.size());
}

// AddressMap against std::unordered_map over `operations` random inserts, erases and finds of `keys`
// addresses (and an erase_if of the odd values every 4,096) whose homes lie in the first or last
// sixteenth of any table (its hash's top 4 bits 0 or 15): long probe runs that wrap around the
// table's end, where erasure must shift entries back across it. From `seed`; returns the number of
// answers that differ (0). For tests: the walk's and the observer's maps hold what value ids and
// shared statistics rest on.
int64_t td_walk_check_address_map(int64_t operations, uint64_t seed, int64_t keys) {
  std::vector<int64_t> pool;
  for (int64_t candidate = 0x7f0000000000; static_cast<int64_t>(pool.size()) < keys; candidate += 16) {
    auto top = (static_cast<uint64_t>(candidate) * 0x9E3779B97F4A7C15ULL) >> 60;
    if (top == 0 || top == 15) pool.push_back(candidate);
  }
  AddressMap<int64_t> map;
  std::unordered_map<int64_t, int64_t> expected;
  int64_t differences = 0;
  for (int64_t step = 0; step < operations; ++step) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;  // a 64-bit LCG: its high bits
    auto key = pool[(seed >> 33) % pool.size()];
    switch ((seed >> 20) % 4) {
      case 0: case 1:
        map[key] = step;
        expected[key] = step;
        break;
      case 2:
        map.erase(key);
        expected.erase(key);
        break;
      default: {
        auto found = map.find(key);
        auto want = expected.find(key);
        differences += (found == nullptr) != (want == expected.end()) || (found != nullptr && found->second != want->second);
      }
    }
    differences += map.size() != expected.size();
    if (step % 4096 == 2047) {  // erase_if: the entries whose values are odd
      map.erase_if([](int64_t, int64_t value) { return value % 2 != 0; });
      std::erase_if(expected, [](const auto& entry) { return entry.second % 2 != 0; });
    }
    if (step % 4096 == 4095) {
      map.clear();
      expected.clear();
    }
  }
  for (const auto& [key, value] : expected) differences += !map.contains(key) || map.find(key)->second != value;
  return differences;
}

// The args interned so far: their number; td_walk_arg(i) the i-th, and on which side (0 input).
int td_walk_args(void* walk) { return static_cast<int>(static_cast<Walk*>(walk)->args.size()); }

const char* td_walk_arg(void* walk, int index, int* io) {
  auto& state = *static_cast<Walk*>(walk);
  *io = state.arg_io.at(static_cast<size_t>(index));
  return state.args.at(static_cast<size_t>(index)).c_str();
}

// Walk the drained slots (counts: rows, slots, kept tensors, freed addresses, the first row's
// absolute number; options: the sides recorded, bit 0 inputs and bit 1 outputs, then bit 0 with
// statistics and bit 1 with fingerprints). columns, in native_values.py's order: the rows' op ids,
// backward marks and whether each is recorded (its slots are records); the slots' rows, io, arg,
// element, dtype, flag, ndim, address, version, storage, offset, the flat shapes, device type and
// index, whether the callback summed it, view base; the kept tensors' slots (-1: not handed over);
// the freed addresses; whether the callback took each slot's fingerprint, the flat strides; then
// the outputs, one entry per recorded slot: drained index, value id, view_of (-1: none), statistics
// reference (>= 0 the drained slot whose sums give them, -1 none, <= -2 the entry -2 - ref of
// taken), error code (1 subclass, 2 nested, 3 changed), unread code, arg code, fingerprint
// reference (as the statistics'); and taken: the drained slots whose kept tensor is reduced at the
// flush (-1: the statistics and fingerprint of no elements). Then the unshards (counts[5]: FSDP2's
// copy-ins, in row order): each one's row, where its storages start in the next column (one more
// entry: the end), and the StorageImpl addresses of the buffers it hands out, which hold no value
// of the run from that row on (unwritten.py's UnwrittenStorages.add, as eager.py's copy-in marks them).
// Last, the rows' marks (kCompiled: the slots of its row share no statistics or fingerprint).
// Returns the recorded slots (and the taken entries into *taken_count), or -1 on failure.
int64_t td_walk(void* walk, const int64_t* counts, const int* options, void* const* columns, int64_t* taken_count) {
  try {
    auto& state = *static_cast<Walk*>(walk);
    auto rows = counts[0], slots = counts[1], kept_count = counts[2], freed_count = counts[3], first_row = counts[4];
    auto unshards = counts[5];
    bool want_inputs = options[0] & 1, want_outputs = options[0] & 2;
    bool statistics = options[1] & 1, fingerprints = options[1] & 2;
    auto row_op = column<int32_t>(columns, 0);
    auto row_backward = column<int8_t>(columns, 1);
    auto row_recorded = column<int8_t>(columns, 2);
    auto slot_row = column<int64_t>(columns, 3);
    auto slot_io = column<int8_t>(columns, 4);
    auto slot_arg = column<int16_t>(columns, 5);
    auto slot_element = column<int16_t>(columns, 6);
    auto slot_dtype = column<int8_t>(columns, 7);
    auto slot_flag = column<int8_t>(columns, 8);
    auto slot_ndim = column<int8_t>(columns, 9);
    auto slot_value = column<int64_t>(columns, 10);
    auto slot_version = column<int64_t>(columns, 11);
    auto slot_storage = column<int64_t>(columns, 12);
    auto slot_offset = column<int64_t>(columns, 13);
    auto shape = column<int64_t>(columns, 14);
    auto device_type = column<int8_t>(columns, 15);
    auto device_index = column<int8_t>(columns, 16);
    auto has_stats = column<int8_t>(columns, 17);
    auto slot_base = column<int64_t>(columns, 18);
    auto kept_slot = column<int64_t>(columns, 19);
    auto freed = column<int64_t>(columns, 20);
    auto has_fingerprint = column<int8_t>(columns, 21);
    auto stride = column<int64_t>(columns, 22);
    auto out_slot = static_cast<int64_t*>(columns[23]);
    auto out_value = static_cast<int64_t*>(columns[24]);
    auto out_view_of = static_cast<int64_t*>(columns[25]);
    auto out_stats = static_cast<int64_t*>(columns[26]);
    auto out_error = static_cast<int8_t*>(columns[27]);
    auto out_unread = static_cast<int8_t*>(columns[28]);
    auto out_arg = static_cast<int32_t*>(columns[29]);
    auto out_fingerprint = static_cast<int64_t*>(columns[30]);
    auto taken = static_cast<int64_t*>(columns[31]);
    auto unshard_row = column<int64_t>(columns, 32);
    auto unshard_start = column<int64_t>(columns, 33);
    auto unshard_storage = column<int64_t>(columns, 34);
    auto row_mark = column<int8_t>(columns, 35);
    int64_t next_unshard = 0;

    ++state.drains;
    std::vector<int8_t> kept(static_cast<size_t>(slots), 0);
    for (int64_t entry = 0; entry < kept_count; ++entry) {
      if (kept_slot[entry] >= 0 && kept_slot[entry] < slots) kept[static_cast<size_t>(kept_slot[entry])] = 1;
    }
    int64_t recorded = 0, taken_entries = 0, empty = kNone;
    int64_t last_row = -1, dims = 0;
    OpFacts* op = nullptr;
    bool backward = false, rebuilds = false;
    int64_t restores = kNone;  // a rebuilds row: the forward call whose saved tensor it restores (Call::index)
    int64_t differentiates = kNone;  // a backward row: the forward call whose node runs it (Call::index)
    AddressMap<bool> arguments;  // an unrecorded row's tensor arguments (an in-place op returns one; a set)
    bool has_source = false;
    Source source{};
    bool has_source_value = false;
    Value source_value{kNone, kNone};
    Memory memory;
    bool row_writes = false;  // the row's op has a mutable schema: its tensor arguments' storages may be written
    bool row_collective = false;  // the row's op is a collective: its outputs are tensors it was handed
    // The row's op runs in compiled code (kCompiled): inductor's kernels write buffers there with no
    // aten op and no version moved (a matmul's output in place with its activation, a donated saved
    // activation), so its slots are neither given what an earlier slot took nor kept for a later one,
    // as CaptureSession reads a compiled graph's tensors.
    bool row_compiled = false;
    std::vector<int64_t> written;  // their storages, counted as written once its inputs are walked
    std::vector<int64_t> collective_written;  // a collective row's output storages, each counted written at its first slot
    auto count_written = [&]() {
      for (auto at : written) ++state.writes_into[at];
      written.clear();
    };
    for (int64_t slot = 0; slot < slots; ++slot) {
      int64_t row = slot_row[slot];
      int8_t io = slot_io[slot], flag = slot_flag[slot];
      int64_t address = slot_value[slot], version = slot_version[slot], storage = slot_storage[slot];
      int ndim = slot_ndim[slot];
      memory.storage = storage;
      memory.offset = slot_offset[slot];
      memory.dtype = slot_dtype[slot];
      memory.shape = state.shapes.id(shape + dims, ndim);
      const int64_t* sizes = shape + dims;
      bool is_contiguous = contiguous(sizes, stride + dims, ndim);
      dims += ndim;
      if (row != last_row) {
        count_written();
        last_row = row;
        for (; next_unshard < unshards && unshard_row[next_unshard] <= row; ++next_unshard) {
          for (auto at = unshard_start[next_unshard]; at < unshard_start[next_unshard + 1]; ++at) state.unwritten.insert(unshard_storage[at]);
        }
        has_source = has_source_value = false;
        arguments.clear();
        auto index = row - first_row;
        op = nullptr;
        auto rebuild = state.rebuilds.find(index);
        rebuilds = rebuild != state.rebuilds.end();
        // (the recomputed op whose node saves it may follow its detach: found once all rows are named)
        auto saver = rebuilds && rebuild->second >= 0 ? state.made_by.find(rebuild->second) : state.made_by.end();
        restores = saver != state.made_by.end() ? saver->second.index : kNone;
        bool named = index >= 0 && index < static_cast<int64_t>(state.forward_of.size());  // (a walk without td_walk_rows: none)
        differentiates = named ? state.forward_of[static_cast<size_t>(index)] : kNone;
        row_writes = row_collective = row_compiled = false;
        collective_written.clear();
        if (index >= 0 && index < rows) {
          row_compiled = row_mark[index] & kCompiled;
          auto found = state.ops.find(row_op[index]);
          if (found == state.ops.end()) return -1;  // facts not given: the caller's error
          row_writes = found->second.flags & kMutable;
          row_collective = found->second.flags & kCollective;
          if (row_recorded[index]) {  // (outputs of a row drained before: not recorded)
            op = &found->second;
            backward = row_backward[index] != 0;
          }
        }
      }
      if (io == 0 && row_writes && flag == kPlain) {
        written.push_back(storage);
      } else if (io) {
        count_written();  // before its outputs: they hold what it wrote
        // A collective's outputs come once its work completed, having written them, though no version
        // moved: what was seen on their memory is read again (CaptureSession.wrote at the completion).
        if (row_collective && flag == kPlain &&
            std::find(collective_written.begin(), collective_written.end(), storage) == collective_written.end()) {
          collective_written.push_back(storage);
          ++state.writes_into[storage];
        }
      }
      if (flag == kValue) {  // recorded as it is, where its row and side are
        if (op != nullptr && (io ? want_outputs : want_inputs)) {
          out_slot[recorded] = slot;
          out_value[recorded] = kNone;
          out_view_of[recorded] = kNone;
          out_stats[recorded] = kNone;
          out_error[recorded] = 0;
          out_unread[recorded] = 0;
          out_arg[recorded] = state.arg_code(*op, io, slot_arg[slot], slot_element[slot]);
          out_fingerprint[recorded] = kNone;
          ++recorded;
        }
        continue;
      }
      if (op == nullptr) {
        if (io == 0) {
          arguments.insert(address);
        } else if (!arguments.contains(address) && !row_collective) {  // a tensor made unrecorded: the one seen at its address is gone
          state.seen.erase(address);
          state.forget(address, memory);
        }
        continue;
      }
      int64_t numel = 1;
      for (int dim = 0; dim < ndim; ++dim) numel *= sizes[dim];
      int64_t device = static_cast<int64_t>(device_type[slot]) * 256 + device_index[slot];
      bool first_arg = slot_arg[slot] == 0 && slot_element[slot] < 0;  // a view op's source (ValueIds.views)
      bool first = first_arg && flag == kPlain;  // and one whose memory the walk can follow
      if (io == 0 && first) {
        has_source = true;
        source.address = address;
        source.version = version;
        source.numel = numel;
        source.device = device;
        source.contiguous = is_contiguous;
        source.memory = memory;
      }
      const Seen* alias = nullptr;
      int64_t reused = kNone, reused_fingerprint = kNone, seen_at = version;
      bool is_view = false;
      bool is_mutable = op->flags & kMutable;
      // An inference tensor (no version) is read at each slot, as CaptureSession reads one: nothing shared.
      bool versioned = version >= 0;
      if (io && first && has_source && (op->flags & kOneTensor) && !is_mutable && versioned && !row_compiled) {
        alias = state.alias_of(*op, source, memory, numel, device);
        if (alias != nullptr) {  // a copy, or a view reading the memory in the same order, has the same bits in order
          bool in_order = (op->flags & kValuePreserving) ||
                          (memory.offset == source.memory.offset && is_contiguous && source.contiguous);
          reused = alias->stats;
          reused_fingerprint = in_order ? alias->fingerprint : kNone;
          // A dispatch mode sees a view op's output before autograd makes it a view (its own version
          // counter, at 0), so a later read shares what this one took only while its base is at 0.
          is_view = !(op->flags & kValuePreserving);
          if (is_view) seen_at = 0;
          state.seen[address] = Seen{seen_at, memory, reused, reused_fingerprint, state.drains, is_view, state.writes_of(storage)};
        }
      }
      if (io && backward && (op->flags & kAccumulates)) state.summed_in[storage] = version;
      if (!(io ? want_outputs : want_inputs) && !(op->flags & kModule)) {
        if (io == 0 && (is_mutable || (first && (op->flags & kMakesViews)))) {  // ValueIds.see, ValueIds.views
          auto value = state.of(row, io, address, memory, backward, slot_base[slot]);
          if (first_arg) {
            has_source_value = true;
            source_value = value;
          }
        } else if (io && alias == nullptr && !row_collective) {
          state.seen.erase(address);
          state.forget(address, memory);
        }
        continue;
      }
      // A backward op's input first seen over a rebuilt tensor's memory: what autograd unpacked from it,
      // which a dispatch mode sees through its own detach of the rebuilt tensor, sharing its statistics.
      // Several ops may save one tensor (a norm's pow and mul, the projections reading one input): the
      // detach made for the forward call this row differentiates, else the last one made over that memory.
      bool may_unpack = io == 0 && backward && !state.unpacks.empty() && !state.at.contains(address);
      int64_t unpacked = may_unpack ? state.unpacked(memory, differentiates) : 0;
      auto* restored = unpacked != 0 ? state.at.find(unpacked) : nullptr;  // (copied: an insert may move the entries)
      Value restored_value = restored != nullptr && restored->second.memory == memory ? restored->second.value : Value{kNone, kNone};
      auto value = state.of(row, io, address, memory, backward, slot_base[slot], restored_value.id != kNone ? &restored_value : nullptr,
                            row_collective);
      if (io == 0 && first_arg) {
        has_source_value = true;
        source_value = value;
      } else if (io && (op->flags & kMakesViews) && has_source_value && value.id != source_value.id) {
        state.made_view(value, address, memory, source_value);
      }
      if (io && rebuilds) {  // what autograd unpacks in the backward: this tensor
        state.made_in[memory] = value;
        state.unpacks[memory] = address;
        if (restores != kNone) state.unpacks_for[Unpack{memory, restores}] = address;
      }
      int64_t stats = kNone, fingerprint = kNone;
      int8_t error = 0, why = 0;
      if (flag != kPlain) {
        error = flag;
        if (flag == kSubclass) {  // read at the op through its plain tensor where the observer could (find_inner)
          if (statistics && has_stats[slot]) stats = slot;
          if (fingerprints && has_fingerprint[slot]) fingerprint = slot;
        }
      } else if ((why = state.unread(*op, io, slot_arg[slot], slot_element[slot], storage, numel)) != 0) {
      } else if (statistics || fingerprints) {
        if (alias != nullptr) {
          stats = reused;
          fingerprint = reused_fingerprint;
        } else if (auto known = io == 0 && versioned && !row_compiled ? state.seen.find(address) : state.seen.end();
                   known != state.seen.end() && state.still(known->second, memory, version)) {
          stats = known->second.stats;  // an output is a new tensor, or written: only an input is known
          fingerprint = known->second.fingerprint;
        } else if (auto rebuilt = unpacked != 0 && versioned && !row_compiled ? state.seen.find(unpacked) : state.seen.end();
                   rebuilt != state.seen.end() && state.still(rebuilt->second, memory, version)) {
          stats = rebuilt->second.stats;
          fingerprint = rebuilt->second.fingerprint;
          auto shared = rebuilt->second;  // (an insert may move the entries)
          state.seen[address] = shared;  // read again, or viewed, it shares them too
        }
        int64_t own_taken = kNone;  // this slot's own entry of taken, shared by both
        auto own = [&](const int8_t* has) -> int64_t {
          if (has[slot]) return slot;
          if (numel == 0) {
            if (empty == kNone) {
              taken[taken_entries] = kNone;
              empty = -2 - taken_entries++;
            }
            return empty;
          }
          if (!kept[static_cast<size_t>(slot)]) {
            error = kChanged;
            return kNone;
          }
          if (own_taken == kNone) {
            taken[taken_entries] = slot;
            own_taken = -2 - taken_entries++;
          }
          return own_taken;
        };
        bool owned = false;
        if (statistics && stats == kNone) {
          stats = own(has_stats);
          owned = true;
        }
        if (fingerprints && fingerprint == kNone) {
          fingerprint = own(has_fingerprint);
          owned = true;
        }
        if (owned && versioned && !row_compiled && (stats != kNone || fingerprint != kNone)) {
          state.seen[address] = Seen{seen_at, memory, stats, fingerprint, state.drains, is_view, state.writes_of(storage)};
        }
        // An argument an op may write is read again next time: a fused optimizer writes its tensors
        // without moving their versions (CaptureSession.wrote).
        if (io == 0 && is_mutable) state.seen.erase(address);
      }
      out_slot[recorded] = slot;
      out_value[recorded] = value.id;
      out_view_of[recorded] = value.view_of;
      out_stats[recorded] = stats;
      out_error[recorded] = error;
      out_unread[recorded] = why;
      out_arg[recorded] = state.arg_code(*op, io, slot_arg[slot], slot_element[slot]);
      out_fingerprint[recorded] = fingerprint;
      ++recorded;
    }
    count_written();
    for (int64_t index = 0; index < freed_count; ++index) {  // after these slots: another tensor may take them now
      state.at.erase(freed[index]);
      state.seen.erase(freed[index]);
      state.rebuilt.erase(freed[index]);
      state.unwritten.erase(freed[index]);  // a storage's address: the observer holds it until reported freed
    }
    *taken_count = taken_entries;
    return recorded;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // extern "C"
