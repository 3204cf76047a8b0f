/* Text for the language model: a byte-level tokenizer (token = byte, vocab
 * 256: nothing to download or train), the text of Debian's fortunes package
 * or any file, a fixed train/validation split, and batches of random
 * windows drawn from a seeded generator (its offset is the data position a
 * checkpoint keeps). */
#ifndef LM_DATA_H
#define LM_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tensor/tensor.h>

#define LM_FORTUNES_DIR "/usr/share/games/fortunes"
#define LM_VOCAB 256

/* A token stream: bytes. */
typedef struct lm_text {
    uint8_t *tokens;
    int64_t n;
} lm_text;

/* The whole file as tokens; false with the reason in why on failure. */
bool lm_text_load_file(const char *path, lm_text *out, char *why, size_t n);
/* Every plain text file of dir (the fortunes package's: the .dat and .u8
 * index files and subdirectories skipped), in byte order of their names,
 * concatenated. */
bool lm_text_load_dir(const char *dir, lm_text *out, char *why, size_t n);
/* A file or a directory, whichever path is. */
bool lm_text_load(const char *path, lm_text *out, char *why, size_t n);
void lm_text_free(lm_text *t);

/* The text's first (1 - val_fraction) part for training and the rest for
 * validation: views into text (no copies), fixed for a given text. Each
 * part must hold a window of context + 1 tokens; false with why otherwise. */
bool lm_split(const lm_text *text, double val_fraction, int64_t context, lm_text *train,
              lm_text *val, char *why, size_t n);

/* The window starts of one batch: batch numbers uniform in
 * [0, text->n - context - 1], drawn from gen (batch draws of 32 bits each,
 * two per start when the range needs more than 32 bits, the generator's
 * offset advancing by them). */
void lm_draw_starts(const lm_text *text, int64_t context, int64_t batch, ct_generator *gen,
                    int64_t *starts);
/* Inputs [batch, context] and targets (the inputs shifted by one token)
 * int64 on device for the windows at starts. New tensors the caller (or the
 * open scope) owns; false on failure (out of host memory, or the library's
 * error in ct_last_error()). */
bool lm_batch_at(const lm_text *text, const int64_t *starts, int64_t batch, int64_t context,
                 ct_device device, ct_tensor **x, ct_tensor **y);

#endif
