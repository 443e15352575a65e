// torch.save's zip layout (see checkpoint/archive.hpp) and the pickle of a flat tensor dict.
#include "checkpoint/archive.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

namespace qrnn::checkpoint {
namespace detail {
namespace {

constexpr uint16_t kZip64Version = 45;

// Fixed records around the caller's, as torch.save writes them.
const char* const kFormatVersion = "1";
const char* const kStorageAlignment = "64";
const char* const kByteOrder = "little";
const char* const kVersion = "3\n";

struct Cursor {
    uint8_t* p;
    void u16(uint64_t v) {
        for (int i = 0; i < 2; ++i) *p++ = uint8_t(v >> (8 * i));
    }
    void u32(uint64_t v) {
        for (int i = 0; i < 4; ++i) *p++ = uint8_t(v >> (8 * i));
    }
    void u64(uint64_t v) {
        for (int i = 0; i < 8; ++i) *p++ = uint8_t(v >> (8 * i));
    }
    void bytes(const void* src, size_t n) {
        if (n) std::memcpy(p, src, n);
        p += n;
    }
    void fill(uint8_t c, size_t n) {
        std::memset(p, c, n);
        p += n;
    }
};

bool size_needs_zip64(uint64_t size) { return size >= kZip32Limit; }
bool offset_needs_zip64(uint64_t offset) { return offset >= kZip32Limit; }

// Bytes of the ZIP64 extra field in a local header (miniz: sizes when the size overflows,
// the offset when the offset does).
uint64_t local_zip64_extra(uint64_t size, uint64_t header_offset) {
    if (!size_needs_zip64(size) && !offset_needs_zip64(header_offset)) return 0;
    return 4 + (size_needs_zip64(size) ? 16 : 0) + (offset_needs_zip64(header_offset) ? 8 : 0);
}

uint64_t central_zip64_extra(const PlannedRecord& r) { return local_zip64_extra(r.size, r.header_offset); }

// Version needed, flags, method (stored), time and date: the same in both headers.
void header_fields(Cursor& c, const PlannedRecord& r) {
    c.u16(r.zip64 ? kZip64Version : 0);
    c.u16(r.size ? kFlagsWithDescriptor : kFlagsNoDescriptor);
    c.u16(0);  // stored
    c.u16(0);  // time
    c.u16(0);  // date
}

// The ZIP64 extra field (64-bit sizes, then offset, where they overflow), if the record has one.
void zip64_extra_field(Cursor& c, const PlannedRecord& r) {
    const uint64_t extra = local_zip64_extra(r.size, r.header_offset);
    if (!extra) return;
    c.u16(1);
    c.u16(extra - 4);
    if (size_needs_zip64(r.size)) {
        c.u64(r.size);
        c.u64(r.size);
    }
    if (offset_needs_zip64(r.header_offset)) c.u64(r.header_offset);
}

void check_name(const std::string& name) {
    if (name.empty() || name.front() == '/' || name.back() == '/')
        throw std::invalid_argument("checkpoint record name '" + name + "' must be a relative file name");
    if (name.find('\\') != std::string::npos || name.find('\0') != std::string::npos ||
        ("/" + name + "/").find("/../") != std::string::npos || ("/" + name + "/").find("/./") != std::string::npos)
        throw std::invalid_argument("checkpoint record name '" + name + "' has '..', '.', '\\' or NUL parts");
    if (name == "constants.pkl")  // its presence makes torch.load treat the file as TorchScript
        throw std::invalid_argument("checkpoint record name 'constants.pkl' is reserved by TorchScript");
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace

std::string archive_prefix(const std::string& path) {
    // torch's basename(): after the last '/' or '\\', up to the last '.'
    size_t start = 0;
    for (size_t i = 0; i < path.size(); ++i)
        if (path[i] == '/' || path[i] == '\\') start = i + 1;
    size_t end = path.size();
    for (size_t i = end; i > start; --i)
        if (path[i - 1] == '.') {
            end = i - 1;
            break;
        }
    std::string prefix = start < end ? path.substr(start, end - start) : std::string();
    return prefix.empty() ? "archive" : prefix;
}

Plan make_plan(const SaveRequest& request) {
    if (request.path.empty()) throw std::invalid_argument("checkpoint path must not be empty");
    Plan plan;
    plan.prefix = archive_prefix(request.path);
    static const char* const reserved[] = {"data.pkl",  ".format_version", ".storage_alignment",
                                           "byteorder", "version",         ".data/serialization_id"};
    struct Item {
        std::string name;
        uint64_t size;
    };
    std::vector<Item> items;
    items.reserve(request.records.size() + 6);
    items.push_back({"data.pkl", request.pickle.size()});
    items.push_back({".format_version", std::strlen(kFormatVersion)});
    items.push_back({".storage_alignment", std::strlen(kStorageAlignment)});
    items.push_back({"byteorder", std::strlen(kByteOrder)});
    plan.first_user_record = items.size();
    std::vector<std::string> seen;
    seen.reserve(request.records.size());
    for (const Record& r : request.records) {
        check_name(r.name);
        for (const char* fixed : reserved)
            if (r.name == fixed)
                throw std::invalid_argument("checkpoint record name '" + r.name + "' is written by the writer itself");
        seen.push_back(r.name);
        items.push_back({r.name, r.size});
    }
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
        throw std::invalid_argument("checkpoint record names must be unique");
    items.push_back({"version", std::strlen(kVersion)});
    plan.serialization_id_record = items.size();
    items.push_back({".data/serialization_id", kSerializationIdSize});

    uint64_t cursor = 0;
    plan.records.reserve(items.size());
    for (auto& item : items) {
        PlannedRecord r;
        r.name = plan.prefix + "/" + item.name;
        if (r.name.size() > 0xFFFF) throw std::invalid_argument("checkpoint record name is too long: " + item.name);
        r.size = item.size;
        r.header_offset = cursor;
        r.zip64 = local_zip64_extra(r.size, cursor) != 0;
        const uint64_t start = cursor + kLocalHeaderSize + r.name.size() + 4 + local_zip64_extra(r.size, cursor);
        const uint64_t pad = (kAlignment - start % kAlignment) % kAlignment;
        r.payload_offset = start + pad;
        r.descriptor_offset = r.payload_offset + r.size;
        r.descriptor_size = r.size == 0 ? 0 : (r.zip64 ? 24 : 16);
        cursor = r.descriptor_offset + r.descriptor_size;
        plan.records.push_back(std::move(r));
    }
    plan.central_offset = cursor;
    for (const auto& r : plan.records) plan.central_size += kCentralHeaderSize + r.name.size() + central_zip64_extra(r);
    plan.file_size = plan.central_offset + plan.central_size + kEnd64Size + kLocator64Size + kEndSize;
    plan.staging_size = (plan.file_size + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
    return plan;
}

void write_headers(const Plan& plan, const SaveRequest& request, uint8_t* image) {
    for (size_t i = 0; i < plan.records.size(); ++i) {
        const PlannedRecord& r = plan.records[i];
        const uint64_t zip64_extra = local_zip64_extra(r.size, r.header_offset);
        const uint64_t fb_size = r.payload_offset - (r.header_offset + kLocalHeaderSize + r.name.size() + zip64_extra);
        Cursor c{image + r.header_offset};
        c.u32(kLocalHeaderSig);
        header_fields(c, r);
        c.u32(0);  // crc, sizes: in the descriptor
        c.u32(0);
        c.u32(0);
        c.u16(r.name.size());
        c.u16(zip64_extra + fb_size);
        c.bytes(r.name.data(), r.name.size());
        zip64_extra_field(c, r);
        c.u16(0x4246);  // "FB"
        c.u16(fb_size - 4);
        c.fill('Z', fb_size - 4);
    }
    auto put = [&](size_t index, const void* data, size_t n) {
        if (n) std::memcpy(image + plan.records[index].payload_offset, data, n);
    };
    put(0, request.pickle.data(), request.pickle.size());
    put(1, kFormatVersion, std::strlen(kFormatVersion));
    put(2, kStorageAlignment, std::strlen(kStorageAlignment));
    put(3, kByteOrder, std::strlen(kByteOrder));
    put(plan.serialization_id_record - 1, kVersion, std::strlen(kVersion));
}

void write_descriptor(const PlannedRecord& r, uint8_t* image) {
    if (r.descriptor_size == 0) return;
    Cursor c{image + r.descriptor_offset};
    c.u32(kDescriptorSig);
    c.u32(r.crc);
    if (r.zip64) {
        c.u64(r.size);
        c.u64(r.size);
    } else {
        c.u32(r.size);
        c.u32(r.size);
    }
}

void write_serialization_id(const Plan& plan, uint8_t* image) {
    uint64_t names = 0xcbf29ce484222325ull, crcs = 0;
    for (size_t i = 0; i < plan.serialization_id_record; ++i) {
        names = fnv1a(names, plan.records[i].name.data(), plan.records[i].name.size());
        const uint32_t crc = plan.records[i].crc;
        crcs = crcs * 1000003u + crc;
    }
    char digits[kSerializationIdSize + 1];
    std::snprintf(digits, sizeof digits, "%020llu%020llu", static_cast<unsigned long long>(names),
                  static_cast<unsigned long long>(crcs));
    std::memcpy(image + plan.records[plan.serialization_id_record].payload_offset, digits, kSerializationIdSize);
}

void write_central_directory(const Plan& plan, uint8_t* image) {
    Cursor c{image + plan.central_offset};
    for (const PlannedRecord& r : plan.records) {
        const uint64_t extra = central_zip64_extra(r);
        c.u32(kCentralSig);
        c.u16(0);  // made by
        header_fields(c, r);
        c.u32(r.crc);
        c.u32(std::min<uint64_t>(r.size, kZip32Limit));
        c.u32(std::min<uint64_t>(r.size, kZip32Limit));
        c.u16(r.name.size());
        c.u16(extra);
        c.u16(0);  // comment
        c.u16(0);  // disk
        c.u16(0);  // internal attributes
        c.u32(0);  // external attributes
        c.u32(std::min<uint64_t>(r.header_offset, kZip32Limit));
        c.bytes(r.name.data(), r.name.size());
        zip64_extra_field(c, r);
    }
    const uint64_t end64_offset = plan.central_offset + plan.central_size;
    const uint64_t n = plan.records.size();
    c.u32(kEnd64Sig);
    c.u64(kEnd64Size - 12);
    c.u16(0x031E);  // made by (as miniz)
    c.u16(kZip64Version);
    c.u32(0);
    c.u32(0);
    c.u64(n);
    c.u64(n);
    c.u64(plan.central_size);
    c.u64(plan.central_offset);
    c.u32(kLocator64Sig);
    c.u32(0);
    c.u64(end64_offset);
    c.u32(1);
    c.u32(kEndSig);
    c.u16(0);
    c.u16(0);
    c.u16(std::min<uint64_t>(n, 0xFFFF));
    c.u16(std::min<uint64_t>(n, 0xFFFF));
    c.u32(std::min<uint64_t>(plan.central_size, kZip32Limit));
    c.u32(std::min<uint64_t>(plan.central_offset, kZip32Limit));
    c.u16(0);
}

}  // namespace detail

namespace detail {

FilePlan make_file_plan(const SaveRequest& request) {
    FilePlan file;
    if (request.archives.empty()) {
        file.plans.push_back(make_plan(request));
        file.bases.push_back(0);
        file.file_size = file.plans[0].file_size;
        file.staging_size = file.plans[0].staging_size;
        return file;
    }
    if (!request.pickle.empty() || !request.records.empty())
        throw std::invalid_argument("a checkpoint request with archives has no pickle or records of its own");
    uint64_t cursor = 0;
    for (const ArchivePart& a : request.archives) {
        SaveRequest part;
        part.path = a.prefix;
        part.pickle = a.pickle;
        part.records = a.records;
        if (a.raw) {
            if (!a.pickle.empty()) throw std::invalid_argument("a raw checkpoint part has no pickle");
            Plan raw;
            raw.raw = true;
            for (const Record& r : a.records) {
                PlannedRecord planned;
                planned.name = r.name;
                planned.size = r.size;
                planned.payload_offset = raw.file_size;
                raw.file_size += r.size;
                raw.records.push_back(std::move(planned));
            }
            raw.serialization_id_record = raw.records.size();  // none
            file.plans.push_back(std::move(raw));
            file.parts.push_back(std::move(part));
            file.bases.push_back(cursor);
            cursor += file.plans.back().file_size;
            continue;
        }
        file.plans.push_back(make_plan(part));
        if (file.plans.back().prefix != a.prefix && !a.prefix.empty())
            throw std::invalid_argument("checkpoint archive prefix '" + a.prefix + "' must have no '.' or '/'");
        file.parts.push_back(std::move(part));
        file.bases.push_back(cursor);
        cursor += file.plans.back().file_size;
    }
    file.file_size = cursor;
    file.staging_size = (cursor + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
    return file;
}

ArchiveLayout layout_of(const FilePlan& file, const SaveRequest& request) {
    ArchiveLayout layout;
    layout.file_size = file.file_size;
    layout.staging_size = file.staging_size;
    for (size_t k = 0; k < file.plans.size(); ++k) {
        const Plan& plan = file.plans[k];
        const SaveRequest& part = file.request(request, k);
        layout.archive_offsets.push_back(file.bases[k]);
        layout.archive_sizes.push_back(plan.file_size);
        for (size_t i = 0; i < part.records.size(); ++i)
            layout.record_offsets.push_back(file.bases[k] + plan.records[plan.first_user_record + i].payload_offset);
    }
    return layout;
}

PlannedSave::Impl& PlanAccess::of(const PlannedSave& planned) {
    if (!planned.impl_) throw std::logic_error("this checkpoint plan was submitted already: plan the save again");
    return *planned.impl_;
}

}  // namespace detail

ArchiveLayout plan_archive(const SaveRequest& request) {
    return detail::layout_of(detail::make_file_plan(request), request);
}

PlannedSave::PlannedSave(SaveRequest request) : impl_(std::make_unique<Impl>()) {
    impl_->plan = detail::make_file_plan(request);
    impl_->layout = detail::layout_of(impl_->plan, request);
    impl_->request = std::move(request);
}
PlannedSave::~PlannedSave() = default;
PlannedSave::PlannedSave(PlannedSave&&) noexcept = default;
PlannedSave& PlannedSave::operator=(PlannedSave&&) noexcept = default;

const SaveRequest& PlannedSave::request() const { return detail::PlanAccess::of(*this).request; }
const ArchiveLayout& PlannedSave::layout() const { return detail::PlanAccess::of(*this).layout; }

void PlannedSave::stage_into(void* staging, uint64_t capacity, std::shared_ptr<Gate> gate) {
    SaveRequest& request = detail::PlanAccess::of(*this).request;
    request.staging = staging;
    request.staging_capacity = capacity;
    request.gate = std::move(gate);
}

// ---- Pickle of a flat {name: tensor} dict ------------------------------------------

namespace {

// Writes the few pickle (protocol 2) opcodes a tensor dict needs.
class PickleWriter {
public:
    PickleWriter() { out_ += "\x80\x02"; }
    void op(char c) { out_ += c; }
    void mark() { op('('); }
    void tuple() { op('t'); }
    void empty_tuple() { op(')'); }
    void global(const char* module, const char* name) {
        op('c');
        out_ += module;
        out_ += '\n';
        out_ += name;
        out_ += '\n';
    }
    void text(const std::string& s) {
        op('X');
        u32(s.size());
        out_ += s;
    }
    void integer(int64_t v) {
        if (v >= 0 && v < 256) {
            op('K');
            out_ += char(v);
        } else if (v >= 0 && v < 65536) {
            op('M');
            out_ += char(v & 0xFF);
            out_ += char(v >> 8);
        } else if (v >= INT32_MIN && v <= INT32_MAX) {
            op('J');
            u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
        } else {  // LONG1: 8 little-endian two's-complement bytes
            op('\x8a');
            out_ += char(8);
            for (int i = 0; i < 8; ++i) out_ += char(static_cast<uint64_t>(v) >> (8 * i));
        }
    }
    void int_tuple(const std::vector<int64_t>& v) {
        if (v.empty()) return empty_tuple();
        mark();
        for (int64_t x : v) integer(x);
        tuple();
    }
    std::string take() {
        op('.');
        return std::move(out_);
    }

private:
    void u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) out_ += char(v >> (8 * i));
    }
    std::string out_;
};

uint64_t reach_bytes(const TensorRef& t, const std::vector<int64_t>& strides, size_t elsize) {
    int64_t last = t.storage_offset;
    for (size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shape[d] == 0) return uint64_t(t.storage_offset) * elsize;
        last += (t.shape[d] - 1) * strides[d];
    }
    return uint64_t(last + 1) * elsize;
}

}  // namespace

size_t element_size(ScalarType type) { return detail::storage_class(type).bytes; }

SaveRequest tensor_dict_request(const std::string& path, const std::vector<TensorRef>& tensors) {
    SaveRequest request;
    request.path = path;
    struct Stored {
        const void* data;
        uint64_t bytes;
        ScalarType dtype;
        size_t key;
    };
    std::map<const void*, Stored> storages;  // by storage pointer: views share one record
    std::vector<const void*> order;
    std::set<std::string> names;
    std::vector<std::vector<int64_t>> strides_of;
    for (const TensorRef& t : tensors) {
        const std::string who = "tensor '" + t.name + "'";
        for (int64_t s : t.shape)
            if (s < 0) throw std::invalid_argument(who + ": shape must be >= 0");
        std::vector<int64_t> strides = t.strides;
        if (strides.empty()) {
            strides.assign(t.shape.size(), 1);
            for (size_t d = t.shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(t.shape[d], 1);
        }
        if (strides.size() != t.shape.size())
            throw std::invalid_argument(who + ": strides must have one entry per dimension");
        for (int64_t s : strides)
            if (s < 0) throw std::invalid_argument(who + ": strides must be >= 0");
        if (t.storage_offset < 0) throw std::invalid_argument(who + ": storage_offset must be >= 0");
        const size_t elsize = element_size(t.dtype);
        const uint64_t reach = reach_bytes(t, strides, elsize);
        const uint64_t bytes = t.storage_bytes ? t.storage_bytes : reach;
        if (bytes < reach) throw std::invalid_argument(who + ": the view reaches beyond storage_bytes");
        if (bytes % elsize) throw std::invalid_argument(who + ": storage_bytes is not a multiple of the element size");
        if (bytes && !t.storage) throw std::invalid_argument(who + ": storage is a null pointer");
        if (!names.insert(t.name).second) throw std::invalid_argument(who + " appears twice");
        strides_of.push_back(std::move(strides));
        const void* key = t.storage ? t.storage : static_cast<const void*>(&t);  // empty: its own
        auto it = storages.find(key);
        if (it == storages.end()) {
            storages.emplace(key, Stored{t.storage, bytes, t.dtype, order.size()});
            order.push_back(key);
        } else {
            if (it->second.dtype != t.dtype)
                throw std::invalid_argument(who + " shares its storage with a tensor of another dtype");
            it->second.bytes = std::max(it->second.bytes, bytes);
        }
    }
    PickleWriter p;
    p.op('}');  // EMPTY_DICT
    if (!tensors.empty()) p.mark();
    for (size_t i = 0; i < tensors.size(); ++i) {
        const TensorRef& t = tensors[i];
        const void* key = t.storage ? t.storage : static_cast<const void*>(&t);
        const Stored& s = storages.at(key);
        const detail::StorageClass& cls = detail::storage_class(t.dtype);
        p.text(t.name);
        p.global("torch._utils", "_rebuild_tensor_v2");
        p.mark();
        p.mark();  // persistent id ("storage", torch.XStorage, key, location, numel)
        p.text("storage");
        p.global("torch", cls.name);
        p.text(std::to_string(s.key));
        p.text("cpu");
        p.integer(int64_t(s.bytes / cls.bytes));
        p.tuple();
        p.op('Q');  // BINPERSID
        p.integer(t.storage_offset);
        p.int_tuple(t.shape);
        p.int_tuple(strides_of[i]);
        p.op(t.requires_grad ? '\x88' : '\x89');
        p.global("collections", "OrderedDict");  // backward hooks
        p.empty_tuple();
        p.op('R');
        p.tuple();
        p.op('R');
    }
    if (!tensors.empty()) p.op('u');  // SETITEMS
    request.pickle = p.take();
    for (const void* key : order) {
        const Stored& s = storages.at(key);
        request.records.push_back({detail::storage_record_name(s.key), s.data, s.bytes});
    }
    return request;
}

}  // namespace qrnn::checkpoint
