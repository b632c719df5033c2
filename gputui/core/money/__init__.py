"""What hosts cost and how the bill stops: prices and the ledger, spend and budgets, releasing a host (commands or the provider's API), autostop, and the provider clients."""
