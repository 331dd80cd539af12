from eksflow.llm.steps.validate_data.step import main

raise SystemExit(main())
