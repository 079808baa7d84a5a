#include <gradstream/gradstream.h>
#include <stdio.h>
int main(void) {
  gs_config_t cfg;
  if (gs_config_init(&cfg) != GS_OK)
    return 1;
  printf("gradstream %s, %s\n", gs_version_string(), gs_status_string(GS_ERR_TIMEOUT));
  return 0;
}
