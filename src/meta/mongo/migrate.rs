//! Start-up migrations on MongoDB: each rewrites documents of an older shape
//! and finds none on the current one, so it runs at every start.

use bson::{Document, doc};
use futures::TryStreamExt;

use super::{MongoStore, Res};

impl MongoStore {
    /// Runs every migration; what each changed is logged.
    pub(super) async fn migrate(&self) -> Res<()> {
        let users = self.count_user_files().await?;
        if users > 0 {
            tracing::info!(users, "migrated users' file_ids arrays to file_count");
        }
        Ok(())
    }

    /// Replaces a user's `file_ids` array (the shape before issue 22) with
    /// `file_count`, counted from the `files` collection (the truth, even
    /// for a document an older instance wrote both fields to); returns how
    /// many users it rewrote. Each user is rewritten only while it still has
    /// the array, so a second run, or two instances starting together, count
    /// no user twice. Instances of the older shape must be stopped first: one
    /// still committing would push to the array after its count.
    async fn count_user_files(&self) -> Res<usize> {
        let users = self.db.collection::<Document>("users");
        let mut old = users
            .find(doc! {"file_ids": {"$exists": true}})
            .projection(doc! {"_id": 1})
            .await?;
        let mut rewritten = 0;
        while let Some(user) = old.try_next().await? {
            let Some(id) = user.get("_id").cloned() else {
                continue;
            };
            let count = self
                .db
                .collection::<Document>("files")
                .count_documents(doc! {"owner_id": &id})
                .await? as i64;
            let done = users
                .update_one(
                    doc! {"_id": id, "file_ids": {"$exists": true}},
                    doc! {"$set": {"file_count": count}, "$unset": {"file_ids": ""}},
                )
                .await?;
            rewritten += done.modified_count as usize;
        }
        Ok(rewritten)
    }
}
