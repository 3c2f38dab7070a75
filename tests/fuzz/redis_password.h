// For the fuzz targets that see a Redis URL: the same URL with another password.
#pragma once

#include <string>

namespace optireduce_fuzz {

inline char Rotate(char c) {
  auto in = [c](char lo, char hi) { return c >= lo && c <= hi; };
  auto rot = [c](char lo, char hi) { return static_cast<char>(lo + (c - lo + 1) % (hi - lo + 1)); };
  if (in('0', '9')) return rot('0', '9');
  if (in('a', 'f')) return rot('a', 'f');  // hex digits stay hex digits (percent escapes)
  if (in('A', 'F')) return rot('A', 'F');
  if (in('g', 'z')) return rot('g', 'z');
  if (in('G', 'Z')) return rot('G', 'Z');
  return c;
}

// The URL with its password (as the parser delimits it) rotated, or "" if it has none.
inline std::string WithOtherPassword(const std::string& url) {
  const size_t scheme = 8;  // "redis://", any case
  if (url.size() < scheme) return "";
  const size_t slash = url.find('/', scheme);
  const size_t authority_end = slash == std::string::npos ? url.size() : slash;
  const size_t at = url.rfind('@', authority_end == 0 ? 0 : authority_end - 1);
  if (at == std::string::npos || at < scheme) return "";
  const size_t colon = url.find(':', scheme);
  const size_t begin = colon != std::string::npos && colon < at ? colon + 1 : scheme;
  std::string other = url;
  bool changed = false;
  for (size_t i = begin; i < at; ++i) {
    other[i] = Rotate(url[i]);
    changed = changed || other[i] != url[i];
  }
  return changed ? other : "";
}

}  // namespace optireduce_fuzz
