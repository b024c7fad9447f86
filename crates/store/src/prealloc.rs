//! Fallible, up-front allocation of the store's big arrays (arena, index).
//!
//! `vec![0; n]` asks the allocator for zeroed memory, which the kernel hands out as untouched
//! pages: nothing is reserved until each page is first written, so a limit above what the
//! machine has "succeeds" at start and the cell dies later, and an allocation the kernel
//! refuses outright aborts the process. Here the allocation is fallible
//! (`try_reserve_exact`) and every page is written once, so the memory the cell reports
//! as allocated at start really is held from start, and a refusal is an error the caller
//! can report.

/// Elements written per `extend_from_slice`: large enough to be one `memcpy` per 4 KiB page
/// or more, small enough for the stack.
const CHUNK_ELEMENTS: usize = 4096;

/// A vector of `len` zero (default) elements, every page written, or `None` if the system
/// refused the memory.
pub(crate) fn zeroed<T: Copy + Default>(len: usize) -> Option<Vec<T>> {
    let mut v: Vec<T> = Vec::new();
    v.try_reserve_exact(len).ok()?;
    let chunk = [T::default(); CHUNK_ELEMENTS];
    while v.len() < len {
        let n = (len - v.len()).min(CHUNK_ELEMENTS);
        v.extend_from_slice(&chunk[..n]);
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::zeroed;

    #[test]
    fn zeroed_has_the_exact_length_and_capacity() {
        for len in [0, 1, 4095, 4096, 4097, 3 * 4096 + 5] {
            let v = zeroed::<u64>(len).expect("small allocation");
            assert_eq!(v.len(), len);
            assert_eq!(v.capacity(), len);
            assert!(v.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_refused_allocation_is_none_not_an_abort() {
        // More than any address space holds: the allocator must refuse, not abort.
        assert!(zeroed::<u8>(isize::MAX as usize).is_none());
        assert!(zeroed::<u64>(usize::MAX / 16).is_none());
    }
}
