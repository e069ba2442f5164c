/* The sandbox ("pause") process of every pod: holds the pod's namespaces open, reaps orphaned
 * children when it is PID 1 of a shared PID namespace, and exits on SIGINT or SIGTERM.
 * Built statically by build.rs and packed by cairn into its built-in sandbox image. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void on_chld(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction term = {.sa_handler = on_term};
    struct sigaction chld = {.sa_handler = on_chld, .sa_flags = SA_NOCLDSTOP};
    if (getpid() != 1) {
        static const char msg[] = "pause: warning: not running as PID 1\n";
        (void)!write(2, msg, sizeof msg - 1);
    }
    if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
        sigaction(SIGCHLD, &chld, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
