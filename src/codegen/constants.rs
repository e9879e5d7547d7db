//! The model's tensor constants as an object file of their own, written straight from where the
//! elements are (for a TVM export, pages of the memory-mapped export) to the file the linker
//! reads. Holding them in the code-generation object would copy every weight into memory two or
//! three times; a model of several gigabytes would not compile. The object has one writable
//! section with every constant at the offset the program tables expect (`tables::TensorPlacement`)
//! and one hidden symbol at its start, `abi::CONSTANTS_SYMBOL`.

use std::io::Write;
use std::path::Path;

use object::elf;
use object::write::StreamingBuffer;
use object::write::elf::{FileHeader, SectionHeader, Sym, Writer};

use super::tables::TensorPlacement;
use crate::abi;
use crate::vm::{Constant, Executable, SharedBytes};

/// The x86-64 psABI's flag of a section beyond the small code model's reach (object has no name
/// for it).
const SHF_X86_64_LARGE: u64 = 0x1000_0000;

/// Alignment of the section, and of each constant in it (the runtime's kernels want 64).
const ALIGN: u64 = 64;

/// The constants object, ready to be written.
pub struct ConstantsObject {
    pieces: Vec<(u64, SharedBytes)>,
    size: u64,
    machine: u16,
    flags: u32,
    /// The section: on x86-64 a large-data one (`.ldata`, SHF_X86_64_LARGE), which the linker
    /// places after `.bss`: gigabytes of weights between the code and its `.bss` would put the
    /// runtime's 32-bit PC-relative references to its own variables out of range.
    section_name: &'static [u8],
    section_flags: u64,
}

impl ConstantsObject {
    /// The tensor constants of `exec`, at the places `placement` gave them.
    pub fn new(exec: &Executable, placement: &TensorPlacement, target: &target_lexicon::Triple) -> ConstantsObject {
        let pieces = exec
            .constants
            .iter()
            .zip(&placement.offsets)
            .filter_map(|(c, at)| match (c, at) {
                (Constant::Tensor(t), Some(at)) => Some((*at, t.data.clone())),
                _ => None,
            })
            .collect();
        use target_lexicon::Architecture;
        let (machine, flags) = match target.architecture {
            Architecture::Aarch64(_) => (elf::EM_AARCH64, 0),
            // The ABI flags cranelift gives its objects: compressed instructions, double-float ABI;
            // the linker refuses to mix objects whose flags differ.
            Architecture::Riscv64(_) => (elf::EM_RISCV, elf::EF_RISCV_RVC | elf::EF_RISCV_FLOAT_ABI_DOUBLE),
            _ => (elf::EM_X86_64, 0),
        };
        let writable = (elf::SHF_ALLOC | elf::SHF_WRITE) as u64;
        let (section_name, section_flags): (&[u8], u64) = if machine == elf::EM_X86_64 {
            (b".ldata.rvm_constants", writable | SHF_X86_64_LARGE)
        } else {
            (b".data.rvm_constants", writable)
        };
        // An empty section still needs a byte for its symbol to have an address.
        ConstantsObject { pieces, size: placement.size.max(1), machine, flags, section_name, section_flags }
    }

    /// Writes the object to `path`, streaming the elements.
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        let file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        let mut buffer = StreamingBuffer::new(file);
        let mut w = Writer::new(object::Endianness::Little, true, &mut buffer);
        w.reserve_file_header();
        let section_name = w.add_section_name(self.section_name);
        w.reserve_null_section_index();
        let section = w.reserve_section_index();
        let data_offset = w.reserve(self.size as usize, ALIGN as usize);
        let symbol_name = w.add_string(abi::CONSTANTS_SYMBOL.as_bytes());
        w.reserve_null_symbol_index();
        w.reserve_symbol_index(Some(section));
        w.reserve_symtab_section_index();
        w.reserve_symtab();
        w.reserve_strtab_section_index();
        w.reserve_strtab();
        w.reserve_shstrtab_section_index();
        w.reserve_shstrtab();
        w.reserve_section_headers();

        let header = FileHeader {
            os_abi: elf::ELFOSABI_NONE,
            abi_version: 0,
            e_type: elf::ET_REL,
            e_machine: self.machine,
            e_entry: 0,
            e_flags: self.flags,
        };
        w.write_file_header(&header).map_err(std::io::Error::other)?;
        w.write_align(ALIGN as usize);
        let zeros = [0u8; 4096];
        let mut at = 0u64;
        let pad = |w: &mut Writer, to: u64, at: &mut u64| {
            while *at < to {
                let n = (to - *at).min(zeros.len() as u64) as usize;
                w.write(&zeros[..n]);
                *at += n as u64;
            }
        };
        for (offset, bytes) in &self.pieces {
            pad(&mut w, *offset, &mut at);
            w.write(bytes);
            at += bytes.len() as u64;
        }
        pad(&mut w, self.size, &mut at);
        w.write_null_symbol();
        w.write_symbol(&Sym {
            name: Some(symbol_name),
            section: Some(section),
            st_info: (elf::STB_GLOBAL << 4) | elf::STT_OBJECT,
            st_other: elf::STV_HIDDEN,
            st_shndx: 0,
            st_value: 0,
            st_size: self.size,
        });
        w.write_strtab();
        w.write_shstrtab();
        w.write_null_section_header();
        w.write_section_header(&SectionHeader {
            name: Some(section_name),
            sh_type: elf::SHT_PROGBITS,
            sh_flags: self.section_flags,
            sh_addr: 0,
            sh_offset: data_offset as u64,
            sh_size: self.size,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: ALIGN,
            sh_entsize: 0,
        });
        w.write_symtab_section_header(1);
        w.write_strtab_section_header();
        w.write_shstrtab_section_header();
        debug_assert_eq!(w.reserved_len(), w.len());
        buffer.result()?;
        buffer.into_inner().flush()
    }
}

impl crate::link::StreamedObject for ConstantsObject {
    fn write_to(&self, path: &Path) -> std::io::Result<()> {
        ConstantsObject::write_to(self, path)
    }
}
