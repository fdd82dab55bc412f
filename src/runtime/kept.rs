//! Per-worker free lists of emptied containers (a stream's frame queues, a head's field
//! ranges), so that the next user reuses an allocation instead of making one. Each list is
//! a thread-local of its user's, bounded by the count it gives here; what a full list, or a
//! thread that is ending, cannot take is dropped.

use std::cell::RefCell;
use std::thread::LocalKey;

/// One worker's kept containers of one kind.
pub type Kept<T> = RefCell<Vec<T>>;

/// A kept container, or a new one when none is kept.
pub fn take<T: Default>(list: &'static LocalKey<Kept<T>>) -> T {
    list.try_with(|l| l.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `item` (emptied by the caller) unless `list` holds `max` already.
pub fn give_back<T>(list: &'static LocalKey<Kept<T>>, item: T, max: usize) {
    let _ = list.try_with(|l| {
        let mut l = l.borrow_mut();
        if l.len() < max {
            l.push(item);
        }
    });
}
