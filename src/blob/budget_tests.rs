use std::{sync::Arc, time::Duration};

use super::{BudgetLimits, LetGo, MemoryBudget, Refused, UNIT};
use crate::metrics::Metrics;

fn budget(bytes: u64, per_user: u64, wait: Option<Duration>) -> Arc<MemoryBudget> {
    let limits = BudgetLimits {
        bytes,
        per_user,
        wait,
    };
    MemoryBudget::new(limits, &Metrics::default())
}

#[tokio::test]
async fn a_reservation_past_the_budget_waits_for_one_given_back() {
    let budget = budget(10 * UNIT, 0, None);
    let first = budget.claim(None).reserve(8 * UNIT).await.unwrap();
    let second = budget.claim(None);
    let waiting = tokio::spawn(async move { second.reserve(4 * UNIT).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "only 2 units are free");
    assert_eq!(budget.waiters.get(), 1);
    drop(first);
    let second = waiting.await.unwrap().unwrap();
    assert_eq!((budget.used(), budget.peak()), (4 * UNIT, 8 * UNIT));
    assert_eq!((budget.waiters.get(), budget.waits.get()), (0, 1));
    drop(second);
    assert_eq!(budget.used(), 0);
}

#[tokio::test]
async fn a_reservation_larger_than_the_budget_gets_the_whole_budget() {
    let budget = budget(4 * UNIT, 0, None);
    let mut all = budget.claim(None).reserve(100 * UNIT).await.unwrap();
    assert_eq!(all.bytes(), 4 * UNIT);
    all.shrink_to(UNIT);
    assert_eq!(budget.used(), UNIT);
    let rest = budget.claim(None).reserve(3 * UNIT).await.unwrap();
    assert_eq!(budget.used(), 4 * UNIT);
    drop((all, rest));
    assert_eq!(budget.used(), 0);
    assert_eq!(budget.units.available_permits(), 4);
}

#[tokio::test]
async fn one_user_holds_at_most_its_share_and_another_still_gets_room() {
    let budget = budget(10 * UNIT, 4 * UNIT, None);
    let a = budget.claim(Some("a"));
    let held = a.reserve(3 * UNIT).await.unwrap();
    // Larger than the share: the whole share, once a's own is given back.
    let more = tokio::spawn(async move { a.reserve(100 * UNIT).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!more.is_finished(), "a's share is spent, not the budget");
    let b = budget.claim(Some("b")).reserve(4 * UNIT).await.unwrap();
    assert_eq!(budget.used(), 7 * UNIT);
    drop(held);
    let more = more.await.unwrap().unwrap();
    assert_eq!(more.bytes(), 4 * UNIT);
    drop((more, b));
    assert_eq!(budget.used(), 0);
    assert!(
        budget.users.lock().unwrap().is_empty(),
        "idle shares forgotten"
    );
}

#[tokio::test]
async fn a_wait_past_its_limit_or_a_let_go_is_refused_and_holds_nothing() {
    let budget = budget(4 * UNIT, 4 * UNIT, Some(Duration::from_millis(100)));
    let all = budget.claim(Some("a")).reserve(4 * UNIT).await.unwrap();
    let refused = budget.claim(Some("b")).reserve(UNIT).await.err();
    assert_eq!(refused, Some(Refused::Busy(Duration::from_millis(100))));
    assert_eq!(budget.busy.get(), 1);
    let let_go: LetGo = Arc::new(|| Box::pin(async {}));
    let refused = budget.claim(Some("a")).let_go_on(Some(let_go));
    assert_eq!(refused.reserve(UNIT).await.err(), Some(Refused::LetGo));
    assert_eq!((budget.used(), budget.waiters.get()), (4 * UNIT, 0));
    drop(all);
    assert_eq!(budget.units.available_permits(), 4);
    assert!(budget.users.lock().unwrap().is_empty());
}
