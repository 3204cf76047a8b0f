/* Files for the fuzz targets: the library's readers take paths, so inputs
 * go through in-memory files instead of the disk. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

static void die(const char *what) {
    fprintf(stderr, "fuzz: %s: %s\n", what, strerror(errno));
    abort();
}

static int open_scratch(int slot) {
    int fd = memfd_create(slot ? "cten-fuzz-1" : "cten-fuzz-0", MFD_CLOEXEC);
    if (fd >= 0) return fd;
    char tmpl[] = "/tmp/cten-fuzz-XXXXXX";
    fd = mkstemp(tmpl);
    if (fd < 0) die("cannot create a scratch file");
    unlink(tmpl);
    return fd;
}

const char *fz_file(int slot, const void *data, size_t size) {
    static int fds[2] = {-1, -1};
    static char paths[2][64];
    slot = slot ? 1 : 0;
    if (fds[slot] < 0) {
        fds[slot] = open_scratch(slot);
        snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
    }
    int fd = fds[slot];
    if (ftruncate(fd, 0) != 0) die("ftruncate");
    const char *p = data;
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, p + done, size - done, (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("pwrite");
        done += (size_t)w;
    }
    return paths[slot];
}

static char dir[64];

static void remove_dir(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

const char *fz_dir(void) {
    if (dir[0]) return dir;
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/cten-fuzz-XXXXXX", base);
    if (!mkdtemp(dir)) die("mkdtemp");
    atexit(remove_dir);
    return dir;
}
