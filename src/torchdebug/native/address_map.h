// AddressMap: a hash map from addresses to values, shared by the native sources that include it
// (observer.cpp, slot_walk.cpp). build.py builds a source again when a header it includes changes.

#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

namespace {  // each library its own copy: nothing crosses between them

// What a key type needs: a value no key takes (an empty entry) and a hash (mixed again by the map).
// An address or other int64 key is never INT64_MIN; a source gives MapKey for its own key types.
template <typename K>
struct MapKey;
template <>
struct MapKey<int64_t> {
  static constexpr int64_t empty() { return INT64_MIN; }
  static bool is_empty(int64_t key) { return key == INT64_MIN; }
  static uint64_t hash(int64_t key) { return static_cast<uint64_t>(key); }
};

template <typename V, typename K = int64_t>
class AddressMap {
 public:
  struct Entry {
    K first = MapKey<K>::empty();
    V second{};
  };
  Entry* end() const { return nullptr; }
  Entry* find(const K& key) { return const_cast<Entry*>(static_cast<const AddressMap*>(this)->find(key)); }
  const Entry* find(const K& key) const {
    if (size_ == 0) return nullptr;
    for (size_t at = home(key);; at = (at + 1) & mask_) {
      if (entries_[at].first == key) return &entries_[at];
      if (MapKey<K>::is_empty(entries_[at].first)) return nullptr;
    }
  }
  bool contains(const K& key) const { return find(key) != nullptr; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  V& operator[](const K& key) {
    if (2 * (size_ + 1) > entries_.size()) grow();
    size_t at = home(key);
    for (; !MapKey<K>::is_empty(entries_[at].first); at = (at + 1) & mask_) {
      if (entries_[at].first == key) return entries_[at].second;
    }
    entries_[at].first = key;
    ++size_;
    return entries_[at].second;
  }
  void insert(const K& key) { (*this)[key]; }  // a set's insert (V unused)
  // Insert (key, value) unless key is there (std::unordered_map's try_emplace).
  void try_emplace(const K& key, const V& value) {
    if (!contains(key)) (*this)[key] = value;
  }
  // Erase every entry for which drop(key, value) is true, in time linear in the table.
  template <typename F>
  void erase_if(F drop) {
    std::vector<K> dropped;
    for (auto& entry : entries_) {
      if (!MapKey<K>::is_empty(entry.first) && drop(entry.first, entry.second)) dropped.push_back(entry.first);
    }
    for (auto key : dropped) erase(key);
  }
  void erase(const K& key) {
    auto* found = find(key);
    if (found == nullptr) return;
    size_t hole = static_cast<size_t>(found - entries_.data());
    for (size_t next = (hole + 1) & mask_; !MapKey<K>::is_empty(entries_[next].first); next = (next + 1) & mask_) {
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
  size_t home(const K& key) const { return static_cast<size_t>((MapKey<K>::hash(key) * 0x9E3779B97F4A7C15ULL) >> shift_); }
  void grow() {
    std::vector<Entry> old(std::max<size_t>(16, 2 * entries_.size()));
    old.swap(entries_);
    mask_ = entries_.size() - 1;
    shift_ = 64 - static_cast<int>(__builtin_ctzll(entries_.size()));
    size_ = 0;
    for (auto& entry : old) {
      if (!MapKey<K>::is_empty(entry.first)) (*this)[entry.first] = std::move(entry.second);
    }
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace
