//! GPUs as chunks: one NVLink group's bitmap of cards in use, and the aligned chunk (1, 2, 4
//! or 8 GPUs, aligned to its size inside a group) a replica is bound to.

use tangram_shared::CHUNK_SIZES;

/// One NVLink domain of at most 8 GPUs, as a bitmap of the cards in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuGroup {
    size: u8,
    used: u8,
}

fn mask(start: u8, len: u8) -> u8 {
    let bits = if len >= 8 { 0xffu16 } else { (1u16 << len) - 1 };
    ((bits << start) & 0xff) as u8
}

impl GpuGroup {
    /// A group of `size` GPUs (clamped to 8), all free.
    pub fn new(size: u8) -> Self {
        Self {
            size: size.min(8),
            used: 0,
        }
    }
    /// GPUs in the group.
    pub fn size(&self) -> u8 {
        self.size
    }
    /// GPUs in use.
    pub fn used(&self) -> u8 {
        self.used.count_ones() as u8
    }
    /// Aligned starts for a chunk of `len` GPUs that fit in the group.
    pub fn starts(&self, len: u8) -> impl Iterator<Item = u8> + '_ {
        let ok = CHUNK_SIZES.contains(&len) && len <= self.size;
        (0..self.size)
            .step_by(len.max(1) as usize)
            .filter(move |s| ok && s + len <= self.size)
    }
    /// True when the chunk is inside the group, aligned and entirely free.
    pub fn is_free(&self, start: u8, len: u8) -> bool {
        CHUNK_SIZES.contains(&len)
            && start.is_multiple_of(len)
            && start + len <= self.size
            && self.used & mask(start, len) == 0
    }
    /// The free aligned chunk of `len` GPUs that keeps larger chunks whole: among the free
    /// starts, the one whose enclosing buddy blocks are the most used (best fit), lowest
    /// start on ties.
    pub fn best_fit(&self, len: u8) -> Option<u8> {
        self.starts(len)
            .filter(|&s| self.is_free(s, len))
            .max_by_key(|&s| {
                let mut score = 0u32;
                let mut block = len * 2;
                while block <= 8 {
                    let b = s - s % block;
                    let used =
                        (self.used & mask(b, block.min(self.size.saturating_sub(b)))).count_ones();
                    score = score * 16 + used;
                    block *= 2;
                }
                (score, std::cmp::Reverse(s))
            })
    }
    /// Marks a chunk used. Panics in debug builds if any card was already used.
    pub fn take(&mut self, start: u8, len: u8) {
        debug_assert!(self.is_free(start, len), "chunk {start}+{len} is not free");
        self.used |= mask(start, len);
    }
    /// Marks a chunk free.
    pub fn release(&mut self, start: u8, len: u8) {
        self.used &= !mask(start, len);
    }
}

/// Where a replica lives: GPUs `start .. start + len` of group `group` on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chunk {
    /// Index of the NVLink group on the node.
    pub group: u16,
    /// First GPU, counted inside the group.
    pub start: u8,
    /// GPUs in the chunk: 1, 2, 4 or 8.
    pub len: u8,
}

impl Chunk {
    /// True when the two chunks share a GPU.
    pub fn overlaps(&self, other: &Chunk) -> bool {
        self.group == other.group
            && self.start < other.start + other.len
            && other.start < self.start + self.len
    }
}
