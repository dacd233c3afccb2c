// Whole-file reads for small inputs (configs, tokenizers, markers, text corpora): one call that names the file,
// what it is and the OS error when it cannot be read. Not for tensor data (ckpt/ streams and maps those).
#pragma once

#include <string>

namespace moecore {

// The bytes of `path`. `what` says what the file is in the error message ("tokenizer file", "--input").
std::string read_file(const std::string& path, const char* what);

}  // namespace moecore
