// AddressMap: a hash map from addresses to values, shared by the native sources that include it
// (observer.cpp, slot_walk.cpp). build.py builds a source again when a header it includes changes.

#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

namespace {  // each library its own copy: nothing crosses between them

// A hash map from addresses (TensorImpl, StorageImpl) and other int64 keys (never INT64_MIN) to V,
// open addressing with linear probing and backward-shift erasure: one array, no node allocated per
// entry. The walk and the observer's callback make several lookups and inserts a slot, a million
// slots a step at scale, where std::unordered_map's allocation per node (and its hash's division)
// was most of their time. An insert may move every entry: no reference into it is held across one.
template <typename V>
class AddressMap {
 public:
  struct Entry {
    int64_t first = kEmpty;
    V second{};
  };
  Entry* end() const { return nullptr; }
  Entry* find(int64_t key) { return const_cast<Entry*>(static_cast<const AddressMap*>(this)->find(key)); }
  const Entry* find(int64_t key) const {
    if (size_ == 0) return nullptr;
    for (size_t at = home(key);; at = (at + 1) & mask_) {
      if (entries_[at].first == key) return &entries_[at];
      if (entries_[at].first == kEmpty) return nullptr;
    }
  }
  bool contains(int64_t key) const { return find(key) != nullptr; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  V& operator[](int64_t key) {
    if (2 * (size_ + 1) > entries_.size()) grow();
    size_t at = home(key);
    for (; entries_[at].first != kEmpty; at = (at + 1) & mask_) {
      if (entries_[at].first == key) return entries_[at].second;
    }
    entries_[at].first = key;
    ++size_;
    return entries_[at].second;
  }
  void insert(int64_t key) { (*this)[key]; }  // a set's insert (V unused)
  // Erase every entry for which drop(key, value) is true, in time linear in the table.
  template <typename F>
  void erase_if(F drop) {
    std::vector<int64_t> dropped;
    for (auto& entry : entries_) {
      if (entry.first != kEmpty && drop(entry.first, entry.second)) dropped.push_back(entry.first);
    }
    for (auto key : dropped) erase(key);
  }
  void erase(int64_t key) {
    auto* found = find(key);
    if (found == nullptr) return;
    size_t hole = static_cast<size_t>(found - entries_.data());
    for (size_t next = (hole + 1) & mask_; entries_[next].first != kEmpty; next = (next + 1) & mask_) {
      size_t want = home(entries_[next].first);  // it may fill the hole if the hole lies on its probe path
      bool stays = hole <= next ? (hole < want && want <= next) : (hole < want || want <= next);
      if (!stays) {
        entries_[hole] = std::move(entries_[next]);
        hole = next;
      }
    }
    entries_[hole] = Entry{};
    --size_;
  }
  void clear() {  // in time linear in the entries held: a table mostly empty is let go, not swept
    if (size_ == 0) return;
    if (entries_.size() > 64 && 4 * size_ < entries_.size()) {
      std::vector<Entry>().swap(entries_);  // (a row's inputs after a foreach op's hundreds)
      mask_ = 0;
    } else {
      std::fill(entries_.begin(), entries_.end(), Entry{});
    }
    size_ = 0;
  }

 private:
  static constexpr int64_t kEmpty = INT64_MIN;
  size_t home(int64_t key) const { return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift_); }
  void grow() {
    std::vector<Entry> old(std::max<size_t>(16, 2 * entries_.size()));
    old.swap(entries_);
    mask_ = entries_.size() - 1;
    shift_ = 64 - static_cast<int>(__builtin_ctzll(entries_.size()));
    size_ = 0;
    for (auto& entry : old) {
      if (entry.first != kEmpty) (*this)[entry.first] = std::move(entry.second);
    }
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace
