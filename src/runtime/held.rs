//! A place in a count kept on one thread, given back when dropped: things being opened
//! (sessions waiting for their exit's or upstream's answer) count against a table's bound
//! from the start, so concurrent openings cannot together pass it.

use std::cell::Cell;

/// One place taken in a count.
pub struct Held<'a>(&'a Cell<usize>);

impl<'a> Held<'a> {
    /// A place in `count`, if `count` and `others` (the table's entries now) together stay
    /// under `max`.
    pub fn take(count: &'a Cell<usize>, others: usize, max: usize) -> Option<Held<'a>> {
        if count.get() + others >= max {
            return None;
        }
        count.set(count.get() + 1);
        Some(Held(count))
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        assert!(self.0.get() > 0, "a held place is given back once");
        self.0.set(self.0.get() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_with_the_table_and_given_back() {
        let count = Cell::new(0);
        let a = Held::take(&count, 1, 3).expect("a place");
        let b = Held::take(&count, 1, 3).expect("a place");
        assert!(
            Held::take(&count, 1, 3).is_none(),
            "1 entry + 2 opening = 3"
        );
        drop(a);
        assert_eq!(count.get(), 1);
        assert!(Held::take(&count, 1, 3).is_some());
        drop(b);
        assert_eq!(count.get(), 0);
    }
}
