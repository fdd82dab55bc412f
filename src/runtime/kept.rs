//! Per-worker free lists of emptied containers (a stream's frame queues, a head's field
//! ranges), so that the next user reuses an allocation instead of making one. Each list is
//! a thread-local of its user's, bounded by the counts it gives here; what a full list, or
//! a thread that is ending, cannot take is dropped.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::thread::LocalKey;

/// One worker's kept containers of one kind.
pub type Kept<T> = RefCell<Vec<T>>;

/// A container a free list can keep: how much room it holds, and emptying it.
pub trait Container: Default {
    fn room(&self) -> usize;
    fn empty(&mut self);
}

impl<T> Container for Vec<T> {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn empty(&mut self) {
        self.clear();
    }
}

impl<T> Container for VecDeque<T> {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn empty(&mut self) {
        self.clear();
    }
}

/// A kept container, or a new one when none is kept.
pub fn take<T: Container>(list: &'static LocalKey<Kept<T>>) -> T {
    list.try_with(|l| l.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `item`, emptied, unless it holds no room or more than `room_max` (memory stays
/// bounded), or `list` holds `count_max` already.
pub fn give_back<T: Container>(
    list: &'static LocalKey<Kept<T>>,
    mut item: T,
    room_max: usize,
    count_max: usize,
) {
    let room = item.room();
    if room == 0 || room > room_max {
        return;
    }
    // Emptied before the list is touched: dropping what it held may end another user.
    item.empty();
    let _ = list.try_with(|l| {
        let mut l = l.borrow_mut();
        if l.len() < count_max {
            l.push(item);
        }
    });
}
