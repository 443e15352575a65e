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
#include <string>
#include <vector>

#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint::detail {

constexpr uint64_t kAlignment = 64;            // payload alignment (torch's kFieldAlignment)
constexpr uint64_t kIoAlignment = kStagingAlignment;  // O_DIRECT buffer / offset / length alignment
constexpr uint64_t kZip32Limit = 0xFFFFFFFFu;  // at or above: ZIP64 fields
constexpr size_t kSerializationIdSize = 40;

struct PlannedRecord {
    std::string name;             // full name inside the archive, "<prefix>/<record>"
    uint64_t size = 0;            // payload bytes
    uint64_t header_offset = 0;   // local header
    uint64_t payload_offset = 0;
    uint64_t descriptor_offset = 0;
    uint32_t descriptor_size = 0; // 0 (empty payload), 16, or 24 (ZIP64)
    bool zip64 = false;           // size or header offset needs 64-bit fields
    uint32_t crc = 0;             // filled by the writer
};

struct Plan {
    std::string prefix;
    std::vector<PlannedRecord> records;  // file order
    size_t first_user_record = 0;        // index of SaveRequest::records[0]
    size_t serialization_id_record = 0;  // index of ".data/serialization_id"
    uint64_t central_offset = 0;
    uint64_t central_size = 0;
    uint64_t file_size = 0;
    uint64_t staging_size = 0;           // file_size rounded up to kIoAlignment
};

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
