//! Doubly linked lists of keys over one node arena and one index, which the
//! list-based policies (LRU, S3-FIFO, W-TinyLFU) share.

use std::collections::HashMap;

/// "No node": the end of a list.
const NO_NODE: u32 = u32::MAX;

pub(super) struct Node {
    pub(super) key: u64,
    previous: u32,
    next: u32,
    /// Which of the owner's lists the node is on.
    pub(super) list: u8,
    /// A small per-key counter (S3-FIFO's access frequency); unused elsewhere.
    pub(super) counter: u8,
}

/// Up to `LISTS` doubly linked lists of keys sharing one node arena and one index,
/// so that finding a key, moving it to the front of any list and removing it are
/// all O(1). The front of a list is its newest end, the back its oldest.
pub(super) struct KeyLists<const LISTS: usize> {
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    fronts: [u32; LISTS],
    backs: [u32; LISTS],
    lengths: [usize; LISTS],
    node_of: HashMap<u64, u32>,
}

impl<const LISTS: usize> KeyLists<LISTS> {
    pub(super) fn with_capacity(capacity_entries: usize) -> Self {
        Self {
            nodes: Vec::with_capacity(capacity_entries),
            free_nodes: Vec::new(),
            fronts: [NO_NODE; LISTS],
            backs: [NO_NODE; LISTS],
            lengths: [0; LISTS],
            node_of: HashMap::with_capacity(capacity_entries),
        }
    }

    pub(super) fn find(&self, key: u64) -> Option<u32> {
        self.node_of.get(&key).copied()
    }

    pub(super) fn node(&self, index: u32) -> &Node {
        &self.nodes[index as usize]
    }

    pub(super) fn node_mut(&mut self, index: u32) -> &mut Node {
        &mut self.nodes[index as usize]
    }

    pub(super) fn length(&self, list: usize) -> usize {
        self.lengths[list]
    }

    pub(super) fn back(&self, list: usize) -> Option<u32> {
        let back = self.backs[list];
        (back != NO_NODE).then_some(back)
    }

    pub(super) fn link_front(&mut self, index: u32, list: usize) {
        let old_front = self.fronts[list];
        {
            let node = self.node_mut(index);
            node.list = u8::try_from(list).expect("list indexes are below LISTS");
            node.previous = NO_NODE;
            node.next = old_front;
        }
        if old_front == NO_NODE {
            self.backs[list] = index;
        } else {
            self.node_mut(old_front).previous = index;
        }
        self.fronts[list] = index;
        self.lengths[list] += 1;
    }

    pub(super) fn unlink(&mut self, index: u32) {
        let (list, previous, next) = {
            let node = self.node(index);
            (node.list as usize, node.previous, node.next)
        };
        if previous == NO_NODE {
            self.fronts[list] = next;
        } else {
            self.node_mut(previous).next = next;
        }
        if next == NO_NODE {
            self.backs[list] = previous;
        } else {
            self.node_mut(next).previous = previous;
        }
        self.lengths[list] -= 1;
    }

    /// Adds `key`, which must be absent, at the front of `list`.
    pub(super) fn push_front(&mut self, list: usize, key: u64, counter: u8) -> u32 {
        let node = Node {
            key,
            previous: NO_NODE,
            next: NO_NODE,
            list: u8::try_from(list).expect("list indexes are below LISTS"),
            counter,
        };
        let index = match self.free_nodes.pop() {
            Some(index) => {
                self.nodes[index as usize] = node;
                index
            }
            None => {
                assert!(self.nodes.len() < NO_NODE as usize, "key list arena full");
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("asserted below NO_NODE")
            }
        };
        let previous = self.node_of.insert(key, index);
        assert!(previous.is_none(), "key {key} is already in a list");
        self.link_front(index, list);
        index
    }

    pub(super) fn move_to_front(&mut self, index: u32, list: usize) {
        self.unlink(index);
        self.link_front(index, list);
    }

    /// Removes the node from its list and the index, returning its key.
    pub(super) fn remove(&mut self, index: u32) -> u64 {
        self.unlink(index);
        let key = self.node(index).key;
        self.node_of.remove(&key);
        self.free_nodes.push(index);
        key
    }
}
