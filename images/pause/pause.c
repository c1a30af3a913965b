/*
 * The pod sandbox's init process for Stateward's local nodes: holds the pod's namespaces open
 * and does nothing else. Exits 0 on SIGINT/SIGTERM, reaps orphaned children (it is PID 1 of a
 * pod that shares its PID namespace), and otherwise sleeps in pause().
 *
 * Built static so the image needs nothing but this binary:
 *   gcc -Os -static -s -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STATEWARD_PAUSE_VERSION "3.10-stateward1"

static void on_terminate(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void on_child(int signal_number) {
    int saved_errno = errno;
    (void)signal_number;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved_errno;
}

static int install(int signal_number, void (*handler)(int), int flags) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(signal_number, &action, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        printf("pause %s\n", STATEWARD_PAUSE_VERSION);
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: warning: not running as PID 1\n");
    }
    if (install(SIGINT, on_terminate, 0) != 0 || install(SIGTERM, on_terminate, 0) != 0 ||
        install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
    return 42; /* not reached */
}
