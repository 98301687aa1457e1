//! The allocator of the working set's hash tables: the global allocator, with the pages
//! of a large table mapped ahead by `madvise(MADV_POPULATE_WRITE)` (Linux 5.14) instead of
//! one page fault per 4 KiB page as inserts first touch them.
//!
//! A table of millions of slots (a restore of 5M keys: 8,388,608 buckets of 80 bytes,
//! 671 MB) touches every one of its pages as it fills, so mapping them ahead does no
//! extra work and saves a trap per page. A restore reserves its table on a second thread
//! while it orders the entries (`KeyedState::restore`), so the mapping overlaps that work
//! instead of stalling the inserts: measured on the 5M-key restore example, the inserts
//! spent more time in page faults than in the table.

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};
use std::ptr::NonNull;

/// Allocations of at least this many bytes are populated at once (16 MiB: a table of
/// about 200,000 slots; below it the faults cost under a millisecond).
pub(crate) const POPULATE_BYTES: usize = 16 << 20;

/// Bytes populated per `madvise` call (4 MiB, see [`populate`]).
const POPULATE_STEP: usize = 4 << 20;

/// The working set's table allocator (see the module docs). Stateless: every value is
/// interchangeable, and memory it allocates is freed by the global allocator.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct TableAlloc;

#[allow(unsafe_code)]
// SAFETY: every block comes from and returns to `Global` with the caller's layout, so
// `Global`'s guarantees hold unchanged; `populate` changes no byte of a block (it only
// maps its pages), and the type is stateless, so clones are interchangeable.
unsafe impl Allocator for TableAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let block = Global.allocate(layout)?;
        if layout.size() >= POPULATE_BYTES {
            populate(block);
        }
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller passes a block this allocator (so `Global`) returned, with
        // its layout.
        unsafe { Global.deallocate(ptr, layout) }
    }
}

/// Faults in every whole page of `block` for writing (`MADV_POPULATE_WRITE`), on Linux.
/// A hint: an older kernel refuses it (`EINVAL`) and the pages fault in as they are first
/// written, as without it; a failure to populate (memory pressure) leaves the same.
#[allow(unsafe_code)]
fn populate(block: NonNull<[u8]>) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = block.as_ptr().cast::<u8>() as usize;
        let end = start + block.len();
        let (first, last) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        // In pieces: the kernel holds the process's memory-map lock for the length of a
        // call, and a thread that maps memory meanwhile (any large allocation) waits for
        // it. In one call, the restore's other threads stalled for the whole populate.
        let mut at = first;
        while at < last {
            let len = (last - at).min(POPULATE_STEP);
            // SAFETY: [at, at + len) lies inside `block`, memory just allocated and owned
            // by this call's caller; MADV_POPULATE_WRITE only maps its pages writable and
            // changes no byte (a page already mapped keeps its contents).
            let refused =
                unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
            if refused != 0 {
                // An older kernel (EINVAL) or memory pressure: the rest faults in on use.
                return;
            }
            at += len;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = block;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large block comes back with every whole page already mapped (`mincore` reports
    /// each resident before anything wrote to it), and reads, writes and frees like any
    /// other; a small block works the same.
    #[test]
    fn a_populated_block_is_mapped_and_ordinary_memory() {
        for size in [64, POPULATE_BYTES + 12_345] {
            let layout = Layout::from_size_align(size, 16).unwrap();
            let block = TableAlloc.allocate(layout).unwrap();
            let bytes = block.as_ptr().cast::<u8>();
            #[cfg(target_os = "linux")]
            if size >= POPULATE_BYTES {
                const PAGE: usize = 4096;
                let first = (bytes as usize).next_multiple_of(PAGE);
                let pages = (bytes as usize + size) / PAGE - first / PAGE;
                let mut resident = vec![0u8; pages];
                #[allow(unsafe_code)]
                // SAFETY: [first, first + pages pages) lies inside the block, and
                // `resident` has one byte per page, as `mincore` writes.
                let rc = unsafe {
                    libc::mincore(
                        first as *mut libc::c_void,
                        pages * PAGE,
                        resident.as_mut_ptr(),
                    )
                };
                assert_eq!(rc, 0, "mincore failed");
                let mapped = resident.iter().filter(|&&r| r & 1 == 1).count();
                assert_eq!(mapped, pages, "pages not mapped ahead");
            }
            #[allow(unsafe_code)]
            // SAFETY: `block` is `size` bytes, allocated above and freed once below.
            unsafe {
                std::ptr::write_bytes(bytes, 7, size);
                assert_eq!(*bytes.add(size - 1), 7);
                TableAlloc.deallocate(NonNull::new(bytes).unwrap(), layout);
            }
        }
    }
}
