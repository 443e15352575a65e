// torch.save's zip layout, byte for byte: what goes where in a checkpoint file.
//
// Records are stored (never compressed). Each local header has CRC and sizes zero, general
// purpose flags 0x0808 (data descriptor follows, UTF-8 names), and an extra field "FB" of
// 'Z' bytes that pads the payload to a multiple of 64 bytes; a data descriptor with the real
// CRC and sizes follows every non-empty payload. The central directory carries the real
// values; the file always ends with ZIP64 end records. This is what miniz writes for
// PyTorchStreamWriter, and torch.load(mmap=True) may compute payload offsets from exactly
// these rules, so they are followed to the byte.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint::detail {

constexpr uint64_t kAlignment = 64;                   // payload alignment (torch's kFieldAlignment)
constexpr uint64_t kIoAlignment = kStagingAlignment;  // O_DIRECT buffer / offset / length alignment
constexpr uint64_t kZip32Limit = 0xFFFFFFFFu;         // at or above: ZIP64 fields
constexpr size_t kSerializationIdSize = 40;

// Zip records as written here (and checked by qrnn.checkpoint.verify through qrnn._C).
constexpr uint32_t kLocalHeaderSig = 0x04034b50, kDescriptorSig = 0x08074b50;
constexpr uint32_t kCentralSig = 0x02014b50, kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50, kEndSig = 0x06054b50;
constexpr uint64_t kLocalHeaderSize = 30, kCentralHeaderSize = 46;
constexpr uint64_t kEnd64Size = 56, kLocator64Size = 20, kEndSize = 22;
constexpr uint16_t kFlagsWithDescriptor = 0x0808, kFlagsNoDescriptor = 0x0800;

// The record of storage `key` (the key in the pickle's persistent id), as torch names it.
inline std::string storage_record_name(size_t key) { return "data/" + std::to_string(key); }

struct PlannedRecord {
    std::string name;            // full name inside the archive, "<prefix>/<record>"
    uint64_t size = 0;           // payload bytes
    uint64_t header_offset = 0;  // local header
    uint64_t payload_offset = 0;
    uint64_t descriptor_offset = 0;
    uint32_t descriptor_size = 0;  // 0 (empty payload), 16, or 24 (ZIP64)
    bool zip64 = false;            // size or header offset needs 64-bit fields
    uint32_t crc = 0;              // filled by the writer
};

struct Plan {
    bool raw = false;                    // records' bytes only: no headers, descriptors or central directory
    std::string prefix;
    std::vector<PlannedRecord> records;  // file order
    size_t first_user_record = 0;        // index of SaveRequest::records[0]
    size_t serialization_id_record = 0;  // index of ".data/serialization_id"
    uint64_t central_offset = 0;
    uint64_t central_size = 0;
    uint64_t file_size = 0;
    uint64_t staging_size = 0;  // file_size rounded up to kIoAlignment
};

// A file's archives: the request's one, or its `archives` one after another (contiguous).
struct FilePlan {
    std::vector<SaveRequest> parts;  // one per archive, for multi-archive requests (else empty)
                                     // (a raw part's SaveRequest has an empty path)
    std::vector<Plan> plans;         // one per archive
    std::vector<uint64_t> bases;     // each archive's offset in the file
    uint64_t file_size = 0;
    uint64_t staging_size = 0;
    // The request whose pickle and records archive k holds.
    const SaveRequest& request(const SaveRequest& whole, size_t k) const { return parts.empty() ? whole : parts[k]; }
};
FilePlan make_file_plan(const SaveRequest& request);

// Where the records of `request`, laid out as `file`, land.
ArchiveLayout layout_of(const FilePlan& file, const SaveRequest& request);

}  // namespace qrnn::checkpoint::detail

namespace qrnn::checkpoint {
// A planned request's contents; PlanAccess lets the writer take them over.
struct PlannedSave::Impl {
    SaveRequest request;
    detail::FilePlan plan;
    ArchiveLayout layout;
};
}  // namespace qrnn::checkpoint

namespace qrnn::checkpoint::detail {
struct PlanAccess {
    // Throws std::logic_error when `planned` was submitted already.
    static PlannedSave::Impl& of(const PlannedSave& planned);
    // After the writer took the contents over.
    static void consume(PlannedSave& planned) { planned.impl_.reset(); }
};

// torch's legacy storage class of each element type, with torch's dtype name and the element
// size, in ScalarType order (qrnn._C exports the table for the Python pickler).
struct StorageClass {
    const char* dtype;
    const char* name;
    size_t bytes;
};
inline constexpr StorageClass kStorageClasses[] = {
    {"float32", "FloatStorage", 4},
    {"float64", "DoubleStorage", 8},
    {"float16", "HalfStorage", 2},
    {"bfloat16", "BFloat16Storage", 2},
    {"complex64", "ComplexFloatStorage", 8},
    {"complex128", "ComplexDoubleStorage", 16},
    {"int8", "CharStorage", 1},
    {"int16", "ShortStorage", 2},
    {"int32", "IntStorage", 4},
    {"int64", "LongStorage", 8},
    {"uint8", "ByteStorage", 1},
    {"bool", "BoolStorage", 1},
};
static_assert(sizeof kStorageClasses / sizeof kStorageClasses[0] == size_t(ScalarType::Bool) + 1);

inline const StorageClass& storage_class(ScalarType t) {
    if (size_t(t) > size_t(ScalarType::Bool))
        throw std::invalid_argument("unknown checkpoint ScalarType " + std::to_string(int(t)));
    return kStorageClasses[size_t(t)];
}

// The archive prefix torch.save uses for a path: the file's base name without extension.
std::string archive_prefix(const std::string& path);

// Layout of: data.pkl, .format_version, .storage_alignment, byteorder, <user records>,
// version, .data/serialization_id. Throws std::invalid_argument on bad names.
Plan make_plan(const SaveRequest& request);

// Writes every local header and the fixed small payloads (pickle included) into `image`.
void write_headers(const Plan& plan, const SaveRequest& request, uint8_t* image);

// After CRCs are known: the descriptor of record i.
void write_descriptor(const PlannedRecord& record, uint8_t* image);
// The serialization id payload (a hash of record names and CRCs, 40 decimal digits); call
// when all records before it have their CRCs.
void write_serialization_id(const Plan& plan, uint8_t* image);
// Central directory and end records, at plan.central_offset.
void write_central_directory(const Plan& plan, uint8_t* image);

}  // namespace qrnn::checkpoint::detail
