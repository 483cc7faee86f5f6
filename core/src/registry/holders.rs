//! A leaf the registry's snapshots read: who holds each arena that several versions hold,
//! and whether telling a version's owner "shared" tells it nothing it may not know.

use std::collections::HashMap;

use modelshare_device::ArenaHandle;

use crate::tenants::Access;

/// Who holds each arena that versions holding memory hold: by [`ArenaHandle::id`], each
/// holding version's model's owner and access.
#[derive(Debug, Default)]
pub(super) struct Holders(HashMap<usize, Vec<(Option<String>, Access)>>);

impl Holders {
    /// Holders by arena id (arenas of one holder left out or not: one holder says nothing).
    pub(super) fn new(by_arena: HashMap<usize, Vec<(Option<String>, Access)>>) -> Self {
        Self(by_arena)
    }

    /// Whether `arena`, held by a version of a model owned by `owner`, is also held by a
    /// version that owner may see (so telling it "shared" tells it nothing it may not know).
    pub(super) fn shared_for(&self, arena: &ArenaHandle, owner: Option<&str>) -> bool {
        let Some(holders) = self.0.get(&arena.id()) else {
            return false;
        };
        let visible = holders
            .iter()
            .filter(|(holder, access)| match owner {
                None => true,
                Some(me) => {
                    holder.as_deref() == Some(me)
                        || access.public
                        || access.shared_with.contains(me)
                }
            })
            .count();
        // The version itself is one of those its owner sees.
        visible > 1
    }
}
