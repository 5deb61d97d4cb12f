/* libfsdp: FSDP_API marks what the library exports. The library is built with
 * -fvisibility=hidden, so a function is part of the public API (and callable from outside
 * libfsdp.so) exactly when its declaration in include/fsdp/ carries this macro;
 * tests/test_exports.sh holds the two sets equal. */
#ifndef FSDP_API_H
#define FSDP_API_H

#if defined(__GNUC__) || defined(__clang__)
#define FSDP_API __attribute__((visibility("default")))
#else
#define FSDP_API
#endif

#endif
