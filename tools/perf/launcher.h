#pragma once

// Starts N local copies of this program as ranks (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1,
// MASTER_PORT, GS_SECRET in their environment), waits for them with a deadline, and returns
// the first non-zero exit status (killing the others once one fails). The children only exec
// after fork, so the caller may have started threads.
int launchLocalRanks(int nranks, char** argv, int timeoutSeconds);
