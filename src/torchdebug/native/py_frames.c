/* The calling thread's Python frames, read without the GIL: observer.cpp's stacks (python_frames).
 *
 * Only the thread itself changes its frames, and they hold their code objects, so while the thread is
 * inside an op its frame chain can be read with no lock: no frame object is made (PyFrame_GetBack
 * makes one per frame not yet seen from Python) and no reference is taken. The chain is CPython's
 * own (_PyInterpreterFrame, an internal structure), read through its internal header, so this file
 * is built against the running Python's headers (build.load_python_library) on 3.11 through 3.13
 * (a build with the GIL: the free-threaded one is left out, untried); td_frames_supported
 * says 0 elsewhere, and the observer takes frames through Python's C API there. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stdint.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define TD_FRAMES 1
#include <internal/pycore_frame.h>
#else
#define TD_FRAMES 0
#endif

/* Whether td_frames_take reads frames on this Python. */
int td_frames_supported(void) { return TD_FRAMES; }

/* The calling thread's frames, innermost first, as PyEval_GetFrame and PyFrame_GetBack walk them
 * (incomplete frames and the C stack's shims left out): the address of each frame's code object
 * and the byte offset of its last instruction (PyFrame_GetLasti's: -1 before the first), two words
 * a frame in `words`, at most `capacity` frames. Returns how many frames there are (more than
 * `capacity`: call again with room for them), -1 for a thread with no Python thread state, -2
 * where unsupported. */
int64_t td_frames_take(int64_t* words, int64_t capacity) {
#if TD_FRAMES
  PyThreadState* thread = PyGILState_GetThisThreadState();
  if (thread == NULL) return -1;
#if PY_VERSION_HEX >= 0x030D0000
  _PyInterpreterFrame* frame = thread->current_frame;
#else
  _PyInterpreterFrame* frame = thread->cframe->current_frame;
#endif
  int64_t count = 0;
  for (; frame != NULL; frame = frame->previous) {
    if (_PyFrame_IsIncomplete(frame)) continue;
    if (count < capacity) {
      int lasti = _PyInterpreterFrame_LASTI(frame);
#if PY_VERSION_HEX >= 0x030D0000
      words[2 * count] = (int64_t)(intptr_t)_PyFrame_GetCode(frame);
#else
      words[2 * count] = (int64_t)(intptr_t)frame->f_code;
#endif
      words[2 * count + 1] = lasti < 0 ? -1 : (int64_t)lasti * (int64_t)sizeof(_Py_CODEUNIT);
    }
    ++count;
  }
  return count;
#else
  (void)words;
  (void)capacity;
  return -2;
#endif
}
